"""Spec-Bench comparison from Python: every method on the same prompts, interleaved, one process.

    python examples/benchmark.py --drafter model_cards/specdiff-smollm2-135m-instruct --per-category 4

(`hf-specdiff bench` is the same with more options.)
"""

import argparse
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from hf_specdiff.tools.bench import benchmark, markdown_table, read_spec_bench, save
from hf_specdiff.tools.doctor import DTYPES, choose_dtype
from hf_specdiff.tools.verifiers import load_verifier

SPEC_BENCH = Path(__file__).resolve().parents[2] / "shared" / "data" / "spec_bench" / "question.jsonl"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--verifier", default="smollm2-135m-instruct")
    parser.add_argument("--drafter", required=True)
    parser.add_argument("--prompts", default=str(SPEC_BENCH))
    parser.add_argument("--per-category", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--dtype", default="auto", choices=["auto", "bf16", "fp32"],
                        help="auto: the faster on this machine's cost profile (`hf-specdiff doctor`)")
    parser.add_argument("--out", default="results")
    args = parser.parse_args()

    torch.set_num_threads(2)
    dtype = DTYPES[choose_dtype(args.verifier, args.drafter) if args.dtype == "auto" else args.dtype]
    verifier, tokenizer = load_verifier(args.verifier, dtype=dtype)
    drafter = AutoModelForCausalLM.from_pretrained(args.drafter, dtype=dtype, trust_remote_code=True).eval()
    conditioned = getattr(drafter.config, "verifier_layer_ids", None) is not None
    summary = benchmark(verifier, tokenizer, read_spec_bench(args.prompts, args.per_category),
                        drafter=None if conditioned else drafter, conditioned_drafter=drafter if conditioned else None,
                        num_drafts=(1, 4), max_new_tokens=args.max_new_tokens)
    print(markdown_table(summary))
    save(summary, args.out)


if __name__ == "__main__":
    main()
