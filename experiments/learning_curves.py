"""Learning curves of drafter training runs: held-out acceptance at draft positions 1-4 and expected streak against
training tokens, one line per run, with each drafter's cost (ms per drafting forward next to the verifier's).

    python experiments/learning_curves.py RUN_DIR [RUN_DIR ...] --out FOLDER [--dtype bf16|fp32]

Each RUN_DIR is an `hf-specdiff train --out` folder (its log.jsonl, training_recipe.json and drafter). Writes
FOLDER/learning_curves.json and FOLDER/learning_curves.png.
"""

import argparse
import json
import time
from pathlib import Path

import torch

from hf_specdiff.modeling_specdiff import SpecDiffDrafter
from hf_specdiff.tools.threads import torch_threads
from hf_specdiff.tools.verifiers import load_verifier

import verifier_cost


def run_curve(folder: Path) -> dict:
    """One run's settings and its held-out metrics by training tokens."""
    recipe = json.loads((folder / "training_recipe.json").read_text())
    config = recipe["config"]
    tokens_per_step = config["batch_size"] * config["grad_accum"] * config["seq_len"]
    points = [json.loads(line) for line in (folder / "log.jsonl").read_text().splitlines()]
    points = [p for p in points if "acceptance_by_position" in p]
    return {"run": folder.name, "layout": config.get("layout", "specdiff"),
            "num_hidden_layers": config["num_hidden_layers"], "train_rows": recipe["data"]["train_rows"],
            "steps": recipe["steps"], "wall_time_s": recipe["wall_time_s"],
            "points": [{"training_tokens": p["step"] * tokens_per_step,
                        "acceptance_by_position": p["acceptance_by_position"][:4],
                        "expected_streak": p["expected_streak"], "greedy_streak": p["greedy_streak"]}
                       for p in points]}


@torch.no_grad()
def drafting_ms(drafter, verifier, context: int = 300, repeats: int = 12) -> float:
    """Median milliseconds of one drafting forward (a whole block, after a cached context)."""
    drafter.set_verifier(verifier)
    width = len(drafter.config.verifier_layer_ids or []) * (drafter.config.verifier_hidden_size or 0)
    ids = torch.randint(0, drafter.config.vocab_size, (1, context))
    times = []
    for _ in range(repeats):
        cache = drafter.new_cache()
        if width:
            cache.verifier_features.record(0, ids[0], torch.randn(context, width, dtype=verifier.dtype))
        drafter.draft(ids[:, : context - 1], cache, drafter.config.max_draft_tokens)  # fills the context cache
        start = time.perf_counter()
        drafter.draft(ids, cache, drafter.config.max_draft_tokens)
        times.append(time.perf_counter() - start)
    return 1000 * sorted(times)[len(times) // 2]


def plot(curves: list[dict], path: Path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 5, figsize=(20, 3.8))
    for curve in curves:
        tokens = [p["training_tokens"] / 1e6 for p in curve["points"]]
        label = f"{curve['run']} ({curve['drafter_ms']:.1f} ms)"
        for i in range(4):
            axes[i].plot(tokens, [p["acceptance_by_position"][i] for p in curve["points"]], marker="o", label=label)
        axes[4].plot(tokens, [p["expected_streak"] for p in curve["points"]], marker="o", label=label)
    for i, axis in enumerate(axes):
        axis.set_xlabel("training tokens (M)")
        axis.set_title(f"held-out acceptance, position {i + 1}" if i < 4 else "expected streak")
        axis.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+")
    parser.add_argument("--out", required=True)
    parser.add_argument("--verifier", default="smollm2-135m-instruct")
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    verifier, _ = load_verifier(args.verifier, dtype=dtype)
    with torch_threads(args.threads):
        verifier_ms = verifier_cost.forward_ms(verifier, 300, [1, 17])
        curves = []
        for folder in map(Path, args.runs):
            curve = run_curve(folder)
            drafter = SpecDiffDrafter.from_pretrained(folder, dtype=dtype).eval()
            curve["drafter_ms"] = drafting_ms(drafter, verifier)
            curves.append(curve)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = {"verifier_ms": {"1 token": verifier_ms[1], "17 tokens": verifier_ms[17]}, "dtype": args.dtype,
              "threads": args.threads, "runs": curves}
    (out / "learning_curves.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(curves, out / "learning_curves.png")
    print(json.dumps({c["run"]: {"drafter_ms": round(c["drafter_ms"], 2), **c["points"][-1]} for c in curves}, indent=1))
    print(f"verifier ms: {verifier_ms}")


if __name__ == "__main__":
    main()
