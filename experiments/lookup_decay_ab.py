"""Wall-clock A/B in one process: the K=4 + lookup loop with its lookup acceptance decayed by each of `--decay`
(`decoding.LOOKUP_ACCEPTANCE_DECAY`; 1.0: every round weighed alike) against plain `generate`, on the demo's prompts
and Spec-Bench's, methods interleaved per prompt (order reversed every other repeat), each method's fastest of
`--repeats` runs per prompt. Speed is summed tokens over summed seconds per method (in bf16 each setting writes its own
text). `modeled_speedup.py` compares the same settings without timing noise.

    python experiments/lookup_decay_ab.py --decay 1.0 --decay 0.8 [--dtype bf16] [--per-category 2] [--repeats 2] \
        --out ab.json
"""

import argparse
import json
import time
from pathlib import Path
from unittest import mock

import torch

from hf_specdiff import decoding
from hf_specdiff.tools.bench import read_spec_bench
from hf_specdiff.tools.demo import DEMO_PROMPTS
from hf_specdiff.tools.doctor import DTYPES
from hf_specdiff.tools.verifiers import DEFAULT_VERIFIER, load_pair


def run_once(model, drafter, inputs, method, max_new_tokens: int) -> tuple[int, float, float]:
    """(new tokens, seconds, tau) of one generation by `method`: "plain" or a decay."""
    stats = decoding.SpecDiffStats()
    started = time.perf_counter()
    if method == "plain":
        out = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
    else:
        with mock.patch.object(decoding, "LOOKUP_ACCEPTANCE_DECAY", method):
            out = decoding.generate(model, drafter, **inputs, max_new_tokens=max_new_tokens, do_sample=False,
                                    num_drafts=4, lookup_tokens=10, stats=stats)
    seconds = time.perf_counter() - started
    return out.shape[1] - inputs["input_ids"].shape[1], seconds, stats.tau if method != "plain" else 1.0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--decay", type=float, action="append", required=True)
    parser.add_argument("--verifier", default=DEFAULT_VERIFIER)
    parser.add_argument("--drafter", help="a drafter folder (default: the one shipped for --verifier)")
    parser.add_argument("--dtype", choices=DTYPES, default="bf16")
    parser.add_argument("--demo", action=argparse.BooleanOptionalAction, default=True, help="the demo's prompts too")
    parser.add_argument("--spec-bench", default="../shared/data/spec_bench/question.jsonl")
    parser.add_argument("--per-category", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model, tokenizer, drafter = load_pair(args.verifier, args.drafter, dtype=DTYPES[args.dtype])
    drafter.cost_profile(model)  # measured (or read) before any timing
    prompts = [{"id": f"d{i}", "category": "demo", "prompt": p} for i, p in enumerate(DEMO_PROMPTS)] if args.demo else []
    prompts += [{"id": str(i), **row} for i, row in enumerate(read_spec_bench(args.spec_bench, args.per_category))]
    methods = ["plain", *args.decay]
    rows = []
    for prompt in prompts:
        inputs = tokenizer.apply_chat_template([{"role": "user", "content": prompt["prompt"]}], return_tensors="pt",
                                               add_generation_prompt=True, return_dict=True)
        best = {}
        for repeat in range(args.repeats):
            for method in methods[::1 if repeat % 2 == 0 else -1]:
                tokens, seconds, tau = run_once(model, drafter, inputs, method, args.max_new_tokens)
                if method not in best or seconds < best[method]["seconds"]:
                    best[method] = {"tokens": tokens, "seconds": seconds, "tau": tau}
        rows.append({"id": prompt["id"], "category": prompt["category"], "methods": {str(m): best[m] for m in methods}})
        plain_rate = best["plain"]["tokens"] / best["plain"]["seconds"]
        print(f"{prompt['id']:>3} {prompt['category'][:10]:10} " + " | ".join(
            f"{m}: {best[m]['tokens'] / best[m]['seconds'] / plain_rate:.2f}x tau {best[m]['tau']:.2f}"
            for m in methods[1:]), flush=True)
    summary = {}  # speed-up over plain, summed tokens over summed seconds
    for group, selected in (("demo", [r for r in rows if r["category"] == "demo"]),
                            ("spec-bench", [r for r in rows if r["category"] != "demo"])):
        if not selected:
            continue
        rate = {m: sum(r["methods"][m]["tokens"] for r in selected) / sum(r["methods"][m]["seconds"] for r in selected)
                for m in map(str, methods)}
        summary[group] = {m: rate[m] / rate["plain"] for m in rate}
        print(group, {m: round(v, 3) for m, v in summary[group].items()})
    Path(args.out).write_text(json.dumps({"settings": vars(args), "summary": summary, "prompts": rows}, indent=1))


if __name__ == "__main__":
    main()
