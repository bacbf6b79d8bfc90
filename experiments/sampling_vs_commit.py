"""Sampling with this checkout's run-time code (the drafter's remote code and the tree loop `decoding.py`) against
an earlier commit's, for the shipped method (K=4 + lookup), the drafter alone (K=1) and the drop-in path
(`assistant_model=`, each commit with a drafter of its own, so that their draft-length policies learn their own
rounds), next to plain sampling and transformers' prompt lookup: one process, methods interleaved per prompt (order
reversed every other prompt), every method of a prompt from the same seed. Sampled texts differ between methods, so
speed is summed tokens over summed seconds per method. `--temperature 0` compares greedy decoding the same way. Usage:

    python experiments/sampling_vs_commit.py aea45d7 --per-category 2 --max-new-tokens 128 --out results.json
    python experiments/sampling_vs_commit.py 745885f --temperature 0 --dtype fp32 --categories coding,writing --out r.json
"""

import argparse
import importlib
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

import hf_specdiff
from hf_specdiff.tools.bench import read_spec_bench
from hf_specdiff.modeling_specdiff import SpecDiffDrafter
from hf_specdiff.tools.doctor import DTYPES
from hf_specdiff.tools.shipped import shipped_drafter_path
from hf_specdiff.tools.verifiers import load_verifier


def remote_code_at(commit: str) -> list[str]:
    """The run-time modules at `commit`: the remote-code files (`*_specdiff.py`, split into more files over time)
    and the tree loop `decoding.py`."""
    names = subprocess.run(["git", "ls-tree", "--name-only", commit, "hf_specdiff/"], capture_output=True, text=True,
                           check=True).stdout.split()
    return [Path(name).stem for name in names if name.endswith("_specdiff.py") or name.endswith("/decoding.py")]


def package_at(commit: str):
    """hf_specdiff's run-time modules (the remote code and the tree loop, which import only torch, transformers and
    each other) as they were at `commit`, imported as a package of their own."""
    root = Path(tempfile.mkdtemp())
    package = root / f"specdiff_{commit}"
    package.mkdir()
    (package / "__init__.py").write_text("")
    for name in remote_code_at(commit):
        source = subprocess.run(["git", "show", f"{commit}:hf_specdiff/{name}.py"], capture_output=True, text=True,
                                check=True).stdout
        (package / f"{name}.py").write_text(source)
    sys.path.insert(0, str(root))
    try:
        return importlib.import_module(package.name)
    finally:
        sys.path.remove(str(root))


def drop_in(verifier, drafter, inputs, sampling):
    """transformers' assisted generation with `drafter` as `assistant_model` (attached if it reads the verifier)."""
    if drafter.config.is_conditioned:
        drafter.attach(verifier)
    try:
        return verifier.generate(**inputs, **sampling, assistant_model=drafter)
    finally:
        if drafter.config.is_conditioned:
            drafter.detach()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("commit")
    parser.add_argument("--verifier", default="smollm2-135m-instruct")
    parser.add_argument("--drafter", help="a drafter folder (default: the shipped one)")
    parser.add_argument("--prompts", default="../shared/data/spec_bench/question.jsonl")
    parser.add_argument("--per-category", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.7, help="0: greedy (each method's own bf16 text)")
    parser.add_argument("--top-p", type=float, default=0.9)
    parser.add_argument("--seed", type=int, default=0, help="prompt i samples from seed 1000 * seed + i")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    parser.add_argument("--categories", help="comma-separated Spec-Bench categories (default: all)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.set_num_threads(2)
    dtype = DTYPES[args.dtype]
    verifier, tokenizer = load_verifier(args.verifier, dtype=dtype)
    then = package_at(args.commit)
    earlier = importlib.import_module(f"{then.__name__}.decoding")
    drafter_class_then = importlib.import_module(f"{then.__name__}.modeling_specdiff").SpecDiffDrafter
    drafter_path = args.drafter or shipped_drafter_path()
    drafter = SpecDiffDrafter.from_pretrained(drafter_path, dtype=dtype).eval()
    drafter_then = drafter_class_then.from_pretrained(drafter_path, dtype=dtype).eval()
    forwards = []
    verifier.register_forward_hook(lambda *_: forwards.append(1))
    sampling = dict(do_sample=True, temperature=args.temperature, top_p=args.top_p, max_new_tokens=args.max_new_tokens) \
        if args.temperature > 0 else dict(do_sample=False, max_new_tokens=args.max_new_tokens)
    shipped = dict(num_drafts=4, lookup_tokens=10)
    methods = {
        "plain": lambda x: verifier.generate(**x, **sampling),
        "prompt lookup": lambda x: verifier.generate(**x, **sampling, prompt_lookup_num_tokens=10),
        f"drop-in at {args.commit}": lambda x: drop_in(verifier, drafter_then, x, sampling),
        "drop-in, this checkout": lambda x: drop_in(verifier, drafter, x, sampling),
        f"K=1 at {args.commit}": lambda x: earlier.generate(verifier, drafter_then, **x, **sampling, num_drafts=1),
        "K=1, this checkout": lambda x: hf_specdiff.generate(verifier, drafter, **x, **sampling, num_drafts=1),
        f"K=4 + lookup at {args.commit}": lambda x: earlier.generate(verifier, drafter_then, **x, **sampling, **shipped),
        "K=4 + lookup, this checkout": lambda x: hf_specdiff.generate(verifier, drafter, **x, **sampling, **shipped),
    }
    prompts = read_spec_bench(args.prompts, args.per_category)
    if args.categories:
        prompts = [prompt for prompt in prompts if prompt["category"] in args.categories.split(",")]
    totals = {name: [0, 0.0, 0] for name in methods}  # tokens, seconds, verifier forwards
    rows = []
    for index, prompt in enumerate(prompts):
        inputs = tokenizer.apply_chat_template([{"role": "user", "content": prompt["prompt"]}],
                                               add_generation_prompt=True, return_tensors="pt", return_dict=True)
        row = {"category": prompt["category"]}
        for name in list(methods)[:: 1 if index % 2 == 0 else -1]:
            torch.manual_seed(1000 * args.seed + index)
            forwards.clear()
            start = time.perf_counter()
            out = methods[name](inputs)
            seconds = time.perf_counter() - start
            tokens = out.shape[1] - inputs["input_ids"].shape[1]
            row[name] = {"tokens": tokens, "seconds": seconds, "forwards": len(forwards)}
            totals[name] = [totals[name][0] + tokens, totals[name][1] + seconds, totals[name][2] + len(forwards)]
        rows.append(row)
        print(prompt["category"], {n: f"{r['tokens'] / r['seconds']:.1f} tok/s" for n, r in row.items()
                                   if n != "category"}, flush=True)
    plain_rate = totals["plain"][0] / totals["plain"][1]
    summary = {name: {"tok_s": t / s, "speedup": t / s / plain_rate, "tau": t / f} for name, (t, s, f) in totals.items()}
    for name, result in summary.items():
        print(f"{name:36s} {result['tok_s']:6.1f} tok/s  {result['speedup']:5.2f}x  tau {result['tau']:.2f}")
    Path(args.out).write_text(json.dumps({"settings": vars(args), "summary": summary, "prompts": rows}, indent=1))


if __name__ == "__main__":
    main()
