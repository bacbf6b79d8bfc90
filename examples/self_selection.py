"""SpecDiff-2 self-selection: K drafts from one drafter pass, verified together as a prefix tree.

    python examples/self_selection.py --drafter model_cards/specdiff-smollm2-135m-instruct --num-drafts 4 \
        --lookup-tokens 10

Runs the three equivalent entry points (the short form, the `custom_generate` callable and the Hub-style
`custom_generate` folder) and prints tau and acceptance by draft position.
"""

import argparse
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

import hf_specdiff
from hf_specdiff.tools.verifiers import load_verifier

FOLDER = Path(__file__).resolve().parents[1] / "model_cards" / "specdiff-generate"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--verifier", default="smollm2-135m-instruct")
    parser.add_argument("--drafter", required=True)
    parser.add_argument("--num-drafts", type=int, default=4)
    parser.add_argument("--lookup-tokens", type=int, default=10, help="prompt-lookup branch in the tree (0: none)")
    parser.add_argument("--prompt", default="What is the capital of France? Answer in one sentence.")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    args = parser.parse_args()

    verifier, tokenizer = load_verifier(args.verifier, dtype=torch.float32)
    drafter = AutoModelForCausalLM.from_pretrained(args.drafter, trust_remote_code=True).eval()
    inputs = tokenizer.apply_chat_template([{"role": "user", "content": args.prompt}], add_generation_prompt=True,
                                           return_tensors="pt", return_dict=True)
    plain = verifier.generate(**inputs, max_new_tokens=args.max_new_tokens, do_sample=False)
    kwargs = dict(max_new_tokens=args.max_new_tokens, do_sample=False, num_drafts=args.num_drafts,
                  lookup_tokens=args.lookup_tokens)
    stats = hf_specdiff.SpecDiffStats()
    short = hf_specdiff.generate(verifier, drafter, **inputs, stats=stats, **kwargs)
    callable_ = verifier.generate(**inputs, custom_generate=hf_specdiff.specdiff_generate, drafter=drafter, **kwargs)
    folder = verifier.generate(**inputs, custom_generate=str(FOLDER), trust_remote_code=True, drafter=drafter,
                               **kwargs)
    print(tokenizer.decode(short[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True))
    print(f"\nK={args.num_drafts}, lookup {args.lookup_tokens}: tau {stats.tau:.2f}, acceptance by position "
          f"{[round(a, 2) for a in stats.acceptance_by_position]}")
    same = short.tolist() == callable_.tolist() == folder.tolist() == plain.tolist()
    print(f"all entry points identical to plain greedy: {same}")


if __name__ == "__main__":
    main()
