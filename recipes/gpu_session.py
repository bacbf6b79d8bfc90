"""The steps of `recipes/gpu_session.sh` that run in Python, each adding its part to one results JSON.

    python recipes/gpu_session.py env        --results R.json
    python recipes/gpu_session.py exactness  --results R.json [--prompts 3 --max-new-tokens 64]
    python recipes/gpu_session.py sampling   --results R.json [--samples 200]
    python recipes/gpu_session.py bench      --results R.json --bench-dir DIR
    python recipes/gpu_session.py train      --results R.json --kind specdiff|dflash --run-dir DIR --seconds S

Each step runs in its own process (the shell bounds it with a timeout) and writes its part of the results as soon
as it has it, so a step that hangs or crashes loses only itself. Every step takes `--device` (default: cuda when
there is one). Exactness and sampling run the real verifier in fp32 on every entry point: the drop-in
`assistant_model=` path, `hf_specdiff.generate` with K=1 and K=4 + lookup, `custom_generate` (the Hub folder),
transformers' DFlash loop with the dflash drafter loaded as a user loads it (its saved bf16 beside the fp32
verifier) and its `transformers` export; and how often each path reads the device on the host per round.
"""

import argparse
import json
import os
import platform
import subprocess
import sys
import time
import warnings
from pathlib import Path

import torch

from hf_specdiff.costs_specdiff import device_clock as clock  # noqa: E402 - after torch, as hf_specdiff does

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ROOT / "model_cards" / "specdiff-smollm2-135m-instruct"
DFLASH = ROOT / "model_cards" / "specdiff-dflash-smollm2-135m-instruct"
CUSTOM_GENERATE = ROOT / "model_cards" / "specdiff-generate"
VERIFIER = "smollm2-135m-instruct"
PROMPTS = [
    "Rewrite this function so it returns the sum of squares: def f(xs): return sum(xs)",
    "Extract every year from: The bridge opened in 1932, closed in 1989 and reopened in 2004.",
    "Explain speculative decoding in two sentences.",
    "List three uses of a paper clip.",
]


def save(results_file: Path, key: str, value):
    """Merge `value` under `key` into the results JSON (written whole each time: a crash later keeps it)."""
    results = json.loads(results_file.read_text()) if results_file.exists() else {}
    results[key] = value
    tmp = results_file.with_suffix(".tmp")
    tmp.write_text(json.dumps(results, indent=1))
    tmp.replace(results_file)
    print(f"[{key}] " + json.dumps(value)[:2000], flush=True)


def step_env(args):
    def run(command):
        try:
            return subprocess.run(command, shell=True, capture_output=True, text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.SubprocessError) as error:
            return f"failed: {error}"

    import transformers

    flags = run("grep -m1 '^flags' /proc/cpuinfo").split()
    save(args.results, "env", {
        "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "dry_run": bool(os.environ.get("DRY_RUN")),
        "commit": os.environ.get("COMMIT") or run(f"git -C {ROOT} rev-parse --short HEAD") or "unknown",
        "python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
        "device": str(args.device), "gpu": torch.cuda.get_device_name() if args.device.type == "cuda" else None,
        "nvidia_smi": run("nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader"),
        "cpu": run("grep -m1 'model name' /proc/cpuinfo").split(":")[-1].strip(), "cores": os.cpu_count(),
        "cpu_flags": [f for f in flags if f.startswith(("avx", "amx"))],
    })


def _models(device, dtype=torch.float32):
    from transformers import AutoModelForCausalLM

    from hf_specdiff.tools.verifiers import load_verifier

    verifier, tokenizer = load_verifier(VERIFIER, dtype=dtype, device=device)
    drafter = AutoModelForCausalLM.from_pretrained(SHIPPED, dtype=dtype, trust_remote_code=True).to(device).eval()
    return verifier, tokenizer, drafter


def _inputs(tokenizer, prompt: str, device):
    inputs = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                           return_tensors="pt", return_dict=True)
    return {k: v.to(device) for k, v in inputs.items()}


def _entry_points(verifier, drafter, dflash, export):
    """name -> a function of (inputs, options) that generates through that entry point, filling `stats` if given."""
    import hf_specdiff

    def drop_in(inputs, options, stats=None):
        try:
            return verifier.generate(**inputs, **options, assistant_model=drafter.attach(verifier))
        finally:
            drafter.detach()

    return {
        "assistant_model= (drop-in)": drop_in,
        "K=1": lambda inputs, options, stats=None: hf_specdiff.generate(verifier, drafter, **inputs, **options,
                                                                        stats=stats),
        "K=4 + lookup": lambda inputs, options, stats=None: hf_specdiff.generate(
            verifier, drafter, **inputs, **options, num_drafts=4, lookup_tokens=10, stats=stats),
        "custom_generate (Hub folder)": lambda inputs, options, stats=None: verifier.generate(
            **inputs, **options, custom_generate=str(CUSTOM_GENERATE), trust_remote_code=True, drafter=drafter,
            num_drafts=4, lookup_tokens=10, stats=stats),
        "DFlash loop, dflash drafter as saved (bf16)": lambda inputs, options, stats=None: verifier.generate(
            **inputs, **options, assistant_model=dflash, speculation_type="dflash"),
        "DFlash loop, transformers export": lambda inputs, options, stats=None: verifier.generate(
            **inputs, **options, assistant_model=export, speculation_type="dflash"),
        "dflash drafter, K=4 + lookup": lambda inputs, options, stats=None: hf_specdiff.generate(
            verifier, dflash, **inputs, **options, num_drafts=4, lookup_tokens=10, stats=stats),
    }


def _dflash_drafters(verifier, device):
    """The dflash drafter as a user loads it (its saved dtype), and its transformers export in the verifier's."""
    from transformers import AutoModel, AutoModelForCausalLM

    from hf_specdiff.tools.export import export_drafter
    from hf_specdiff.modeling_specdiff import SpecDiffDrafter

    dflash = AutoModelForCausalLM.from_pretrained(DFLASH, trust_remote_code=True).to(device).eval()
    folder = Path(os.environ.get("WORK", "/tmp")) / "gpu_session_export"
    export_drafter(SpecDiffDrafter.from_pretrained(DFLASH), folder, "transformers")
    export = AutoModel.from_pretrained(folder, dtype=verifier.dtype).to(device).eval()
    return dflash, export


def step_exactness(args):
    """fp32 greedy through every entry point against plain greedy, and host reads of device values per round."""
    from hf_specdiff import SpecDiffStats

    verifier, tokenizer, drafter = _models(args.device)
    dflash, export = _dflash_drafters(verifier, args.device)
    entry_points = _entry_points(verifier, drafter, dflash, export)
    options = dict(max_new_tokens=args.max_new_tokens, do_sample=False)
    rows = {name: {"identical": 0, "prompts": 0, "seconds": 0.0, "tau": []} for name in ["plain", *entry_points]}
    for prompt in PROMPTS[: args.prompts]:
        inputs = _inputs(tokenizer, prompt, args.device)
        start = clock(args.device)
        plain = verifier.generate(**inputs, **options)
        rows["plain"]["seconds"] += clock(args.device) - start
        rows["plain"]["identical"] += 1
        rows["plain"]["prompts"] += 1
        for name, run in entry_points.items():
            stats = SpecDiffStats()
            try:
                start = clock(args.device)
                out = run(inputs, options, stats)
                rows[name]["seconds"] += clock(args.device) - start
                rows[name]["identical"] += out.tolist() == plain.tolist()
                rows[name]["tau"].append(stats.tau if stats.rounds else None)
            except Exception as error:  # noqa: BLE001 - a failing path is a result, not the end of the step
                rows[name]["error"] = f"{type(error).__name__}: {error}"[:500]
            rows[name]["prompts"] += 1
        save(args.results, "exactness", {"dtype": "fp32", "max_new_tokens": args.max_new_tokens, "paths": rows})
    if args.device.type == "cuda":
        save(args.results, "host_syncs_per_round", _host_syncs(verifier, tokenizer, drafter, args.device))


def _host_syncs(verifier, tokenizer, drafter, device) -> dict:
    """CUDA's synchronisation warnings (torch.cuda.set_sync_debug_mode) per verifier round, by path: what the loops
    (ours and transformers') wait for the GPU."""
    from hf_specdiff import SpecDiffStats
    from hf_specdiff.tools.bench import _ForwardTimer

    inputs = _inputs(tokenizer, PROMPTS[2], device)
    entry_points = _entry_points(verifier, drafter, None, None)
    counts = {}
    for name in ("K=1", "K=4 + lookup", "assistant_model= (drop-in)"):
        stats, timer = SpecDiffStats(), _ForwardTimer(verifier)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                entry_points[name](inputs, dict(max_new_tokens=64, do_sample=False), stats)
            finally:
                torch.cuda.set_sync_debug_mode("default")
                timer.remove()
        syncs = [w for w in caught if "synchroniz" in str(w.message)]
        counts[name] = {"verifier_forwards": timer.count, "syncs": len(syncs),
                        "per_round": round(len(syncs) / max(timer.count, 1), 2)}
    return counts


def step_sampling(args):
    """A small sampling check: the distribution of the first new tokens, plain sampling against the tree loop
    (K=4 + lookup) and the drop-in path, each `--samples` draws (chi-square test of homogeneity per position)."""
    from scipy.stats import chi2_contingency

    verifier, tokenizer, drafter = _models(args.device)
    entry_points = _entry_points(verifier, drafter, None, None)
    inputs = _inputs(tokenizer, PROMPTS[3], args.device)
    options = dict(max_new_tokens=3, do_sample=True, temperature=1.0, top_p=0.95)
    methods = {"plain": lambda inputs, options, stats=None: verifier.generate(**inputs, **options),
               "K=4 + lookup": entry_points["K=4 + lookup"],
               "assistant_model= (drop-in)": entry_points["assistant_model= (drop-in)"]}
    draws = {name: [] for name in methods}
    torch.manual_seed(0)
    start = time.perf_counter()
    for _ in range(args.samples):
        for name, run in methods.items():
            out = run(inputs, options)
            draws[name].append(out[0, inputs["input_ids"].shape[1]:].tolist())
    result = {"samples": args.samples, "options": options, "seconds": round(time.perf_counter() - start, 1)}
    for name in methods:
        if name == "plain":
            continue
        p_values = []
        for position in range(3):
            tokens = sorted({row[position] for rows in (draws["plain"], draws[name]) for row in rows
                             if len(row) > position})
            table = [[sum(row[position:position + 1] == [t] for row in rows) for t in tokens]
                     for rows in (draws["plain"], draws[name])]
            table = _merge_rare(table)
            p_values.append(float(chi2_contingency(table)[1]) if len(table[0]) > 1 else 1.0)
        result[name] = {"p_values_by_position": p_values}
    save(args.results, "sampling", result)


def _merge_rare(table: list[list[int]], least: int = 5) -> list[list[int]]:
    """Columns with fewer than `least` draws in all merged into one (chi-square needs populated cells)."""
    keep = [i for i in range(len(table[0])) if table[0][i] + table[1][i] >= least]
    rest = [i for i in range(len(table[0])) if i not in keep]
    merged = [[row[i] for i in keep] + ([sum(row[i] for i in rest)] if rest else []) for row in table]
    return [[c for c, total in zip(row, map(sum, zip(*merged))) if total] for row in merged]


def step_profile(args):
    """Where a round's time goes on this device, bf16, after a warm-up: each method's tokens per second on a few
    prompts (plain, K=1, K=4 + lookup), its verifier forwards, host syncs per round, and torch.profiler's top
    operators by host time for one generation of each."""
    from torch.profiler import ProfilerActivity, profile

    from hf_specdiff import SpecDiffStats

    verifier, tokenizer, drafter = _models(args.device, torch.bfloat16)
    entry_points = _entry_points(verifier, drafter, None, None)
    methods = {"plain": lambda inputs, options, stats=None: verifier.generate(**inputs, **options),
               "K=1": entry_points["K=1"], "K=4 + lookup": entry_points["K=4 + lookup"]}
    options = dict(max_new_tokens=args.max_new_tokens, do_sample=False)
    prompts = [_inputs(tokenizer, prompt, args.device) for prompt in PROMPTS[: args.prompts]]
    for run in methods.values():  # warm-up: kernels, allocator, the drafter's measured costs
        run(prompts[0], dict(options, max_new_tokens=16))
    speed = {}
    for name, run in methods.items():
        tokens, seconds, rounds = 0, 0.0, 0
        for inputs in prompts:
            stats = SpecDiffStats()
            start = clock(args.device)
            out = run(inputs, options, stats)
            seconds += clock(args.device) - start
            tokens += out.shape[1] - inputs["input_ids"].shape[1]
            rounds += stats.rounds
        speed[name] = {"tok_s": round(tokens / seconds, 1), "tau": round(tokens / rounds, 2) if rounds else None}
    for name in speed:
        speed[name]["speedup"] = round(speed[name]["tok_s"] / speed["plain"]["tok_s"], 2)
    save(args.results, "profile_speed", speed)
    if args.device.type == "cuda":
        save(args.results, "host_syncs_per_round_bf16", _host_syncs(verifier, tokenizer, drafter, args.device))
    tables = {}
    for name, run in methods.items():
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if args.device.type == "cuda" else [])
        with profile(activities=activities) as prof:
            run(prompts[0], options)
        table = prof.key_averages().table(sort_by="cpu_time_total", row_limit=22, max_name_column_width=60)
        print(f"--- profile: {name}\n{table}", flush=True)
        tables[name] = table.splitlines()[:30]
    save(args.results, "profile_tables", tables)


def step_bench(args):
    """The bench's summary (per method: speed-up, tokens/s, tau, ms per verifier and drafter forward), from the
    prompts it finished if it was cut short."""
    from hf_specdiff.tools.bench import summarize

    finished = args.bench_dir / "results.json"
    if finished.exists():
        summary = json.loads(finished.read_text())
    else:
        lines = [json.loads(line) for line in (args.bench_dir / "records.jsonl").read_text().splitlines() if line]
        settings = next(line["settings"] for line in lines if "settings" in line)
        summary = summarize([r for line in lines for r in line.get("records", [])], settings["methods"])
        summary["settings"] = dict(settings, finished_prompts=sum("records" in line for line in lines))
    save(args.results, "bench", {"settings": summary["settings"], "methods": summary["methods"],
                                 "results": summary["results"]})


def step_train(args):
    """One trainer process's throughput: steps per second of its training loop (start-up apart)."""
    recipe = json.loads((args.run_dir / "training_recipe.json").read_text())
    steps = recipe["steps"] - recipe.get("resumed_from_step", 0)
    loop_s = recipe["wall_time_s"]
    results = json.loads(args.results.read_text()) if args.results.exists() else {}
    train = results.get("train", {})
    train[args.kind] = {"steps": steps, "batch_size": recipe["config"]["batch_size"],
                        "seq_len": recipe["config"]["seq_len"], "precision": recipe["config"]["precision"],
                        "loop_seconds": loop_s, "steps_per_second": round(steps / loop_s, 2),
                        "process_seconds": args.seconds, "machine": recipe.get("machine")}
    save(args.results, "train", train)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("step", choices=["env", "exactness", "sampling", "profile", "bench", "train"])
    parser.add_argument("--results", type=Path, required=True)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--prompts", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--bench-dir", type=Path)
    parser.add_argument("--kind", choices=["specdiff", "dflash"])
    parser.add_argument("--run-dir", type=Path)
    parser.add_argument("--seconds", type=float, default=None, help="the train step's whole process time")
    args = parser.parse_args(argv)
    args.device = torch.device(args.device)
    args.results.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    globals()[f"step_{args.step}"](args)
    print(f"step {args.step}: {time.perf_counter() - started:.1f} s", flush=True)


if __name__ == "__main__":
    sys.exit(main())
