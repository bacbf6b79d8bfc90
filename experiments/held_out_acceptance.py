"""Held-out drafting quality of trained drafters on one large, shared sample of their held-out rows: greedy
acceptance at draft positions 1-4, the greedy and expected streaks, with standard errors (a paired comparison:
every drafter sees the same windows).

    python experiments/held_out_acceptance.py RUN_DIR [RUN_DIR ...] --out FILE.json [--windows 512] [--data FOLDERS]

Each RUN_DIR is an `hf-specdiff train --out` folder trained on the same data with the same held-out split (its
training_recipe.json says which); `--data` evaluates them all on the held-out rows of other data folders instead
(the split is by prompt index, so a run trained on more folders still held out those rows). A conditioned drafter
reads the verifier's features, cached in the data folder (`--feature-cache true`) or computed here.
"""

import argparse
import json
import math
from pathlib import Path

import torch

from hf_specdiff.training.feature_cache import attach_features
from hf_specdiff.modeling_specdiff import SpecDiffDrafter
from hf_specdiff.tools.threads import torch_threads
from hf_specdiff.training.trainer import held_out_metrics, load_training_data, sample_windows, split_rows
from hf_specdiff.tools.verifiers import load_verifier


def held_out(drafter, rows: list[dict], windows: int, block_size: int, seq_len: int, chunk: int = 32) -> dict:
    """`held_out_metrics` over `windows` windows of `rows` (seeded: the same for every drafter), block-weighted."""
    generator = torch.Generator().manual_seed(1234)
    totals, blocks = {}, 0
    for _ in range(0, windows, chunk):
        metrics = held_out_metrics(drafter, sample_windows(rows, chunk, seq_len, 0, generator), block_size)
        n = metrics.pop("blocks", 0)
        for key, value in metrics.items():
            totals[key] = [t + n * v for t, v in zip(totals.get(key, [0.0] * 4), value)] if isinstance(value, list) \
                else totals.get(key, 0.0) + n * value
        blocks += n
    if not blocks:
        raise SystemExit(f"no held-out window holds a whole block of {block_size} tokens: the rows are too short")
    result = {key: [round(v / blocks, 4) for v in value[:4]] if isinstance(value, list) else round(value / blocks, 4)
              for key, value in totals.items()}
    p = result["acceptance_by_position"][0]
    return {**result, "blocks": blocks, "position_1_standard_error": round(math.sqrt(p * (1 - p) / blocks), 4)}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+")
    parser.add_argument("--out", required=True)
    parser.add_argument("--windows", type=int, default=512)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--data", help="data folders (comma-separated) whose held-out rows to use")
    args = parser.parse_args(argv)
    recipes = [json.loads((Path(run) / "training_recipe.json").read_text())["config"] for run in args.runs]
    first = recipes[0]
    if args.data:
        first = {**first, "data": args.data}
    shared = ("eval_fraction", "seq_len") if args.data else ("data", "eval_fraction", "seq_len")
    if any(tuple(r[k] for k in shared) != tuple(first[k] for k in shared) for r in recipes):
        raise SystemExit(f"the runs must share {', '.join(shared)}: their held-out rows differ otherwise")
    verifier, _ = load_verifier(first["verifier"], dtype=torch.float32)
    sources = load_training_data(first["data"], verifier, first["verifier"])
    rows = [row for source in sources for row in source.rows]
    results = {}
    with torch_threads(args.threads):
        for run, recipe in zip(args.runs, recipes):
            drafter = SpecDiffDrafter.from_pretrained(run).eval()
            drafter.set_verifier(verifier)
            if drafter.config.is_conditioned:
                for source in sources:
                    attach_features(source.folder, verifier, drafter, source.rows, progress=False)
            _, held = split_rows(rows, first["eval_fraction"])
            if not held:
                raise SystemExit(f"{first['data']} has no held-out rows at eval_fraction {first['eval_fraction']}")
            results[Path(run).name] = {"steps": recipe["max_steps"], "objective": recipe["objective"],
                                       "kl_weight": recipe["kl_weight"], "kl_weighting": recipe.get("kl_weighting"),
                                       **held_out(drafter, held, args.windows, recipe["block_size"], recipe["seq_len"])}
            print(Path(run).name, json.dumps(results[Path(run).name]), flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"data": first["data"], "held_out_rows": len(held), "windows": args.windows,
                                          "runs": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
