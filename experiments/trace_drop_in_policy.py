"""Trace the drop-in path's draft-length decisions: Spec-Bench prompts in bench order through
`verifier.generate(assistant_model=drafter)`, every round's context length, draft length, accepted tokens and
seconds, and every decision's acceptance rates and predicted round costs, written as JSON; the last category also
runs plain `generate` beside it. Usage:

    python experiments/trace_drop_in_policy.py --until translation --out runs/trace_policy.json
"""

import argparse
import json
import time
from collections import defaultdict

import torch

from hf_specdiff import policies_specdiff
from hf_specdiff.tools.bench import _assisted_generate, read_spec_bench
from hf_specdiff.modeling_specdiff import SpecDiffDrafter
from hf_specdiff.tools.shipped import shipped_drafter_path
from hf_specdiff.tools.verifiers import load_verifier


def record_policy(log: list, where: dict):
    """Wrap `DraftLengthPolicy` and the drafter's `generate` so that every round and decision lands in `log`."""
    policy, drafter = policies_specdiff.DraftLengthPolicy, SpecDiffDrafter
    update, next_length, generate = policy.update, policy.next_length, drafter.generate

    def logged_update(self, num_drafted, num_accepted, seconds=None):
        log.append(dict(where, kind="round", g=num_drafted, accepted=num_accepted, seconds=seconds))
        return update(self, num_drafted, num_accepted, seconds)

    def logged_next_length(self, allow_skip=False):
        length = next_length(self, allow_skip)
        log.append(dict(where, kind="decision", length=length, rates=self.acceptance.rates()[:3].tolist(),
                        costs=self.costs.predict(torch.arange(4)).tolist()))
        return length

    def logged_generate(self, input_ids, *args, **kwargs):
        where["context"] = input_ids.shape[1]
        return generate(self, input_ids, *args, **kwargs)

    policy.update, policy.next_length, drafter.generate = logged_update, logged_next_length, logged_generate


def summary(log: list, category: str) -> dict:
    """Mean round seconds by context (< 160, < 300, longer) and draft length; the category's acceptance."""
    seconds = defaultdict(list)
    for r in log:
        if r["kind"] == "round" and r["seconds"] is not None:
            bucket = "<160" if r["context"] < 160 else "<300" if r["context"] < 300 else ">=300"
            seconds[f"context {bucket}, g={min(r['g'], 3)}"].append(r["seconds"])
    drafted = [r for r in log if r["kind"] == "round" and r["category"] == category and r["g"]]
    decisions = [r for r in log if r["kind"] == "decision" and r["category"] == category]
    accepted = sum(r["accepted"] > 0 for r in drafted)
    return {"round_ms": {k: round(1000 * sum(v) / len(v), 1) for k, v in sorted(seconds.items())},
            "rounds_by_key": {k: len(v) for k, v in sorted(seconds.items())},
            f"{category}_drafting_rounds": len(drafted),
            f"{category}_position_1_acceptance": round(accepted / max(len(drafted), 1), 3),
            f"{category}_estimated_position_1": [round(d["rates"][0], 3) for d in (decisions[0], decisions[-1])],
            f"{category}_predicted_cost_ratio_g1_g0": round(decisions[-1]["costs"][1] / decisions[-1]["costs"][0], 3)}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", default="../shared/data/spec_bench/question.jsonl")
    parser.add_argument("--per-category", type=int, default=2)
    parser.add_argument("--until", default="translation", help="the last category run (with plain beside it)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    torch.set_num_threads(2)
    verifier, tokenizer = load_verifier("smollm2-135m-instruct")
    drafter = SpecDiffDrafter.from_pretrained(shipped_drafter_path()).eval()
    drafter.assistant_lookup_tokens = 0  # the drafter's own policy alone: no prompt-lookup rounds where it skips
    prompts = read_spec_bench(args.prompts, args.per_category)
    last = max(i for i, p in enumerate(prompts) if p["category"] == args.until)
    log, where, outputs = [], {}, []
    record_policy(log, where)
    for prompt in prompts[: last + 1]:
        where["category"] = prompt["category"]
        inputs = tokenizer.apply_chat_template([{"role": "user", "content": prompt["prompt"]}],
                                               add_generation_prompt=True, return_tensors="pt", return_dict=True)
        timed = {}
        methods = {"plain": {}, "drop-in": dict(assistant_model=drafter, attach=True)}
        for method in methods if prompt["category"] == args.until else ["drop-in"]:
            start = time.perf_counter()
            out = _assisted_generate(verifier, inputs, args.max_new_tokens, dict(methods[method]))
            timed[method] = {"seconds": round(time.perf_counter() - start, 2),
                             "tokens": out.shape[1] - inputs["input_ids"].shape[1]}
        outputs.append({"category": prompt["category"], **timed})
        print(outputs[-1], flush=True)
    result = {"summary": summary(log, args.until), "prompts": outputs, "log": log}
    with open(args.out, "w") as f:
        json.dump(result, f)
    print(json.dumps(result["summary"], indent=1))


if __name__ == "__main__":
    main()
