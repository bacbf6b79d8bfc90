"""What sampled drafting costs besides the drafter's forward: processing g draft rows of 49k logits at temperature
0.7, top-p 0.9 and drawing a token from each, with transformers' warpers and `torch.multinomial` (before
CandidateTopPLogitsWarper) against `draft_processors` and `select_tokens` (inverse-CDF draws). Usage:

    python experiments/draft_processors_cost.py --rows 1,4,8,16 --repeats 100
"""

import argparse
import time

import torch
from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopPLogitsWarper

from hf_specdiff.generation_specdiff import draft_processors, select_tokens


def milliseconds(fn, repeats: int) -> float:
    """Mean wall-clock ms of `fn()` over `repeats` calls, after one warm-up call."""
    fn()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - start) / repeats * 1e3


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", default="1,4,8,16")
    parser.add_argument("--vocab-size", type=int, default=49152)
    parser.add_argument("--repeats", type=int, default=100)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    processors = LogitsProcessorList([TemperatureLogitsWarper(0.7), TopPLogitsWarper(0.9)])
    for rows in map(int, args.rows.split(",")):
        logits = torch.randn(rows, args.vocab_size) * 4
        before = milliseconds(lambda: torch.multinomial(processors(None, logits).softmax(-1), 1), args.repeats)
        now = milliseconds(lambda: select_tokens(draft_processors(processors)(None, logits), True), args.repeats)
        print(f"{rows} rows: transformers' warpers + multinomial {before:.2f} ms, "
              f"draft_processors + inverse-CDF draws {now:.2f} ms")


if __name__ == "__main__":
    main()
