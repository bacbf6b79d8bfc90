"""Tokens per verifier forward (tau) of tree configurations and transformers' prompt lookup on Spec-Bench prompts,
with the shipped drafter: `shipped` (K=4 + a 10-token lookup branch, the tree sized by measured cost), `lookup-tree`
(the same with the drafter switched off: the lookup branch alone) and `hf-lookup` (transformers' prompt lookup, 10
tokens). A tree configuration with `:L` holds L lookup drafts (`shipped:4`). In fp32 every method gives plain
greedy's tokens, so their taus compare on the same text; in bf16 each method's text can drift apart (a multi-token
verification rounds differently). Usage:

    python experiments/tree_tau.py --categories qa,translation,rag,extraction --per-category 2 --fp32
"""

import argparse
import json

import torch

import hf_specdiff
from hf_specdiff import policies_specdiff
from hf_specdiff.tools.bench import read_spec_bench
from hf_specdiff.modeling_specdiff import SpecDiffDrafter
from hf_specdiff.tools.shipped import shipped_drafter_path
from hf_specdiff.tools.verifiers import load_verifier

CONFIGS = ("shipped", "lookup-tree", "hf-lookup")


def run(verifier, drafter, inputs, config: str, max_new_tokens: int) -> torch.Tensor:
    config, _, num_lookup_drafts = config.partition(":")
    options = {"num_lookup_drafts": int(num_lookup_drafts)} if num_lookup_drafts else {}
    if config == "hf-lookup":
        return verifier.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False, prompt_lookup_num_tokens=10)
    next_length = policies_specdiff.DraftLengthPolicy.next_length
    if config == "lookup-tree":
        policies_specdiff.DraftLengthPolicy.next_length = lambda self, *args, **kwargs: 0
    try:
        return hf_specdiff.generate(verifier, drafter, **inputs, max_new_tokens=max_new_tokens, do_sample=False,
                                    num_drafts=4, lookup_tokens=10, **options)
    finally:
        policies_specdiff.DraftLengthPolicy.next_length = next_length


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--verifier", default="smollm2-135m-instruct")
    parser.add_argument("--drafter", help="a drafter folder (default: the shipped one)")
    parser.add_argument("--prompts", default="../shared/data/spec_bench/question.jsonl")
    parser.add_argument("--categories", default="qa,translation,rag,extraction")
    parser.add_argument("--per-category", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--fp32", action="store_true")
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    torch.set_num_threads(2)
    verifier, tokenizer = load_verifier(args.verifier, dtype=torch.float32 if args.fp32 else torch.bfloat16)
    drafter = SpecDiffDrafter.from_pretrained(args.drafter or shipped_drafter_path()).eval()
    drafter.cost_profile(verifier)  # measured (once per machine) before forwards are counted
    forwards = []
    verifier.register_forward_hook(lambda *_: forwards.append(1))
    totals = {}  # category -> config -> [tokens, forwards]
    per_prompt = []
    for prompt in read_spec_bench(args.prompts, args.per_category):
        if prompt["category"] not in args.categories.split(","):
            continue
        inputs = tokenizer.apply_chat_template([{"role": "user", "content": prompt["prompt"]}],
                                               add_generation_prompt=True, return_tensors="pt", return_dict=True)
        row = {"category": prompt["category"]}
        for config in args.configs.split(","):
            forwards.clear()
            out = run(verifier, drafter, inputs, config, args.max_new_tokens)
            row[config] = {"tokens": out.shape[1] - inputs["input_ids"].shape[1], "forwards": len(forwards),
                           "text": tokenizer.decode(out[0, inputs["input_ids"].shape[1]:])}
            for key in (prompt["category"], "overall"):
                count = totals.setdefault(key, {}).setdefault(config, [0, 0])
                count[0] += out.shape[1] - inputs["input_ids"].shape[1]
                count[1] += len(forwards)
        per_prompt.append(row)
    result = {key: {config: {"tokens": t, "forwards": f, "tau": round(t / f, 3)} for config, (t, f) in row.items()}
              for key, row in totals.items()}
    print(json.dumps(result, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"settings": vars(args), "results": result, "prompts": per_prompt}, f, indent=1)


if __name__ == "__main__":
    main()
