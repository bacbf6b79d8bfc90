"""Two drafters of the same kind on Spec-Bench in one process, interleaved per prompt (`hf-specdiff bench` takes
one drafter of each kind): CANDIDATE at every path (drop-in, K=1, K=4, K=4 + lookup) and BASELINE on our own loop
(K=1, K=4 + lookup; its methods are labelled "baseline"), next to plain and prompt lookup. Resumable (records.jsonl).

    python experiments/compare_drafters.py CANDIDATE BASELINE --out DIR [--per-category 2] [--max-new-tokens 128] \
        [--method "baseline (K=4) + lookup" --method ...]    # only these (and plain); default: every method
"""

import argparse
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from hf_specdiff.tools.bench import benchmark, markdown_table, read_spec_bench, save, summarize
from hf_specdiff.tools.verifiers import load_verifier

RENAME = {"SpecDiff-2 (K=1)": "baseline (K=1)", "SpecDiff-2 (K=4) + lookup": "baseline (K=4) + lookup"}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("candidate")
    parser.add_argument("baseline")
    parser.add_argument("--prompts", default="../shared/data/spec_bench/question.jsonl")
    parser.add_argument("--per-category", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--method", action="append", help="run only this method (repeatable; plain always runs)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    only = ["prompt lookup", "SpecDiff-2 conditioned drop-in", "SpecDiff-2 conditioned (K=1)",
            "SpecDiff-2 conditioned (K=4)", "SpecDiff-2 conditioned (K=4) + lookup", *RENAME]
    if args.method:
        original = {RENAME.get(name, name): name for name in only}
        unknown = sorted(set(args.method) - set(original))
        if unknown:
            parser.error(f"unknown method(s) {unknown}; choose from {sorted(original)}")
        only = [original[name] for name in args.method]
    prompts = read_spec_bench(args.prompts, args.per_category)
    verifier, tokenizer = load_verifier("smollm2-135m-instruct", dtype=torch.bfloat16)
    candidate, baseline = (AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16, trust_remote_code=True)
                           .eval() for path in (args.candidate, args.baseline))
    if candidate.config.is_conditioned is not True or getattr(candidate.config, "layout", None) == "dflash":
        raise ValueError("the candidate must be a conditioned drafter of the specdiff layout")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    summary = benchmark(verifier, tokenizer, prompts, drafter=baseline, conditioned_drafter=candidate,
                        num_drafts=(1, 4), max_new_tokens=args.max_new_tokens, with_lookup=True, only=only,
                        records_file=out / "records.jsonl", threads=2,
                        run_info={"candidate": args.candidate, "baseline": args.baseline})
    records = [{**r, "method": RENAME.get(r["method"], r["method"])} for r in summary["records"]]
    summary = summarize(records, [RENAME.get(m, m) for m in summary["methods"]])
    summary["settings"] = {**vars(args), "dtype": "bf16", "threads": 2}
    print(markdown_table(summary))
    save(summary, out)


if __name__ == "__main__":
    main()
