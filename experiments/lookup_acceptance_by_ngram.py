"""How often prompt lookup's draft is accepted, by the length of the n-gram it matched: along the verifier's plain
greedy answers to Spec-Bench prompts, at every position, the 10 tokens that followed the latest (and the earliest)
earlier occurrence of the longest n-gram (n <= 4) ending the context, against what greedy decoding wrote next.
Offline: no speculative decoding runs, so the numbers do not depend on a tree or on timing. Usage:

    python experiments/lookup_acceptance_by_ngram.py --per-category 2 --max-new-tokens 128 --out acceptance.json
"""

import argparse
import json

import torch

from hf_specdiff.tools.bench import read_spec_bench
from hf_specdiff.tools.verifiers import load_verifier


def accepted_length(draft: torch.Tensor, truth: torch.Tensor) -> int:
    """How many leading tokens of `draft` equal `truth`'s."""
    n = min(len(draft), len(truth))
    return int((draft[:n] == truth[:n]).long().cumprod(0).sum())


def lookup_matches(ids: torch.Tensor, max_ngram: int) -> tuple[int, torch.Tensor]:
    """The longest n <= max_ngram whose n-gram ending `ids` occurred earlier, and the starts of those occurrences."""
    for n in range(min(max_ngram, ids.shape[0] - 1), 0, -1):
        hits = (ids[:-1].unfold(0, n, 1) == ids[-n:]).all(-1).nonzero().flatten()
        if len(hits):
            return n, hits
    return 0, hits


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--verifier", default="smollm2-135m-instruct")
    parser.add_argument("--prompts", default="../shared/data/spec_bench/question.jsonl")
    parser.add_argument("--per-category", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--lookup-tokens", type=int, default=10)
    parser.add_argument("--max-ngram", type=int, default=4)
    parser.add_argument("--out", default="lookup_acceptance_by_ngram.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(2)
    verifier, tokenizer = load_verifier(args.verifier, dtype=torch.bfloat16)
    counts = {}  # "category/n<N>/<occurrence>" -> [rounds, first token accepted, tokens accepted]
    for item in read_spec_bench(args.prompts, args.per_category):
        inputs = tokenizer.apply_chat_template([{"role": "user", "content": item["prompt"]}],
                                               add_generation_prompt=True, return_tensors="pt", return_dict=True)
        text = verifier.generate(**inputs, max_new_tokens=args.max_new_tokens, do_sample=False)[0]
        for t in range(inputs["input_ids"].shape[1], text.shape[0] - 1):
            n, hits = lookup_matches(text[:t], args.max_ngram)
            for occurrence, hit in (("latest", hits[-1:]), ("earliest", hits[:1])):
                if not n:
                    continue
                start = int(hit) + n
                accepted = accepted_length(text[start:start + args.lookup_tokens], text[t:t + args.lookup_tokens])
                for category in (item["category"], "all"):
                    count = counts.setdefault(f"{category}/n{n}/{occurrence}", [0, 0, 0])
                    count[0] += 1
                    count[1] += accepted > 0
                    count[2] += accepted
        print(item["category"], flush=True)
    rows = {key: {"rounds": r, "first_accepted": round(a / r, 3), "mean_accepted": round(m / r, 2)}
            for key, (r, a, m) in sorted(counts.items())}
    with open(args.out, "w") as f:
        json.dump({"settings": vars(args), "results": rows}, f, indent=1)
    for key, row in rows.items():
        if key.startswith("all/"):
            print(key, row)


if __name__ == "__main__":
    main()
