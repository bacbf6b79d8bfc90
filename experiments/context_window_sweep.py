"""First-token acceptance of a drafter against the window it drafts from (`context_window`), on Spec-Bench prompts.

A drafter trained on short windows (the trainer's `--seq-len`) meets far longer contexts after a long prompt. This
runs the drafter alone (K=1, a fixed draft length, so every round drafts) in fp32, where every window gives the same
text (plain greedy's), once per window, and keeps acceptance by draft position and tau for each.

    python experiments/context_window_sweep.py DRAFTER --windows 209,384,2048 \
        --categories extraction,summarization,rag,writing --out results.json
"""

import argparse
import json
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

import hf_specdiff
from hf_specdiff.tools.bench import read_spec_bench
from hf_specdiff.tools.verifiers import load_verifier


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("drafter")
    parser.add_argument("--windows", default="209,384,2048", help="context_window values (prefix + block)")
    parser.add_argument("--categories", default="extraction,summarization,rag,writing")
    parser.add_argument("--prompts", default="../shared/data/spec_bench/question.jsonl")
    parser.add_argument("--per-category", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--draft-length", type=int, default=8)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.set_num_threads(2)
    verifier, tokenizer = load_verifier("smollm2-135m-instruct", dtype=torch.float32)
    drafter = AutoModelForCausalLM.from_pretrained(args.drafter, dtype=torch.float32, trust_remote_code=True).eval()
    categories = args.categories.split(",")
    prompts = [p for p in read_spec_bench(args.prompts, args.per_category) if p["category"] in categories]
    records = []
    for index, item in enumerate(prompts):
        inputs = tokenizer.apply_chat_template([{"role": "user", "content": item["prompt"]}],
                                               add_generation_prompt=True, return_tensors="pt", return_dict=True)
        for window in map(int, args.windows.split(",")):
            drafter.config.context_window = window
            stats = hf_specdiff.SpecDiffStats()
            out = hf_specdiff.generate(verifier, drafter, **inputs, do_sample=False, draft_length=args.draft_length,
                                       max_new_tokens=args.max_new_tokens, stats=stats)
            records.append({"prompt": index, "category": item["category"],
                            "prompt_tokens": inputs["input_ids"].shape[1], "window": window, "tau": stats.tau,
                            "acceptance": stats.acceptance_by_position[:4],
                            "output": out[0, inputs["input_ids"].shape[1]:].tolist()})
            print(item["category"], records[-1]["prompt_tokens"], window,
                  f"tau {stats.tau:.2f}, acceptance {[round(a, 2) for a in records[-1]['acceptance']]}", flush=True)
    by_window = {}
    for window in map(int, args.windows.split(",")):
        mine = [r for r in records if r["window"] == window]
        by_window[window] = {"tau": sum(r["tau"] for r in mine) / len(mine),
                             "first_token_acceptance": sum(r["acceptance"][0] for r in mine) / len(mine)}
    same_text = all(len({tuple(r["output"]) for r in records if r["prompt"] == i}) == 1 for i in range(len(prompts)))
    Path(args.out).write_text(json.dumps({"settings": vars(args), "dtype": "fp32", "same_text_every_window": same_text,
                                          "mean_by_window": by_window, "records": records}, indent=1))
    print(json.dumps(by_window, indent=1), "same text in every window:", same_text)


if __name__ == "__main__":
    main()
