"""How far a K=4 + lookup round's wall-clock time is from what this machine's cost profile says it costs: per round,
the verifier's forward (timed around `TreeDecoding.verify`, tree attention and all) against
`profile.verifier_seconds(1 + nodes)`, the drafter's call against `profile.drafter_seconds`, and the rest of the round
(drafting the tree, accepting, committing: host work). Plain `generate` is timed per token against the profile's
plain step. This is what `modeled_speedup.py`'s virtual clock leaves out; run it on a quiet machine.

    python experiments/round_cost_calibration.py [--dtype fp32|bf16] [--max-new-tokens 128] [--threads 2]

Under the AVX2 imitation in bf16 (2026-12-06, f35a1ee): tree rounds' forwards 1.22x the profile, host work 1.8 ms a
round, plain `generate` 44.1 ms a token against the profile's 27.8 ms plain step (1.59x: the profile was measured an
hour and a half before, and this shared machine had slowed; timed side by side, a tree forward costs what a chain of
as many tokens does, `verifier_cost.py --tree`).
"""

import argparse
import time
from collections import defaultdict
from unittest import mock

import torch

from hf_specdiff import decoding
from hf_specdiff.tools.demo import DEMO_PROMPTS
from hf_specdiff.tools.doctor import DTYPES
from hf_specdiff.tools.verifiers import DEFAULT_VERIFIER, load_pair


def timed(record: list, function):
    def wrapper(*args, **kwargs):
        started = time.perf_counter()
        result = function(*args, **kwargs)
        record.append(time.perf_counter() - started)
        return result
    return wrapper


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--verifier", default=DEFAULT_VERIFIER)
    parser.add_argument("--drafter", help="a drafter folder (default: the one shipped for --verifier)")
    parser.add_argument("--dtype", choices=DTYPES, default="fp32")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model, tokenizer, drafter = load_pair(args.verifier, args.drafter, dtype=DTYPES[args.dtype])
    profile = drafter.cost_profile(model)
    verify_seconds, draft_seconds, draft_lengths, nodes = [], [], [], []
    verify, draft = decoding.TreeDecoding.verify, timed(draft_seconds, drafter.draft)

    def recorded_verify(self, round_, cache):
        nodes.append((len(round_.tree), round_.committed.shape[1]))
        return timed(verify_seconds, verify)(self, round_, cache)

    def recorded_draft(input_ids, cache, num_tokens, *args, **kwargs):
        draft_lengths.append(num_tokens)
        return draft(input_ids, cache, num_tokens, *args, **kwargs)

    totals = defaultdict(float)
    with mock.patch.object(decoding.TreeDecoding, "verify", recorded_verify), \
            mock.patch.object(drafter, "draft", recorded_draft):
        for prompt in DEMO_PROMPTS:
            inputs = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], return_tensors="pt",
                                                   add_generation_prompt=True, return_dict=True)
            started = time.perf_counter()
            plain = model.generate(**inputs, max_new_tokens=args.max_new_tokens, do_sample=False)
            totals["plain"] += time.perf_counter() - started
            totals["plain_tokens"] += plain.shape[1] - inputs["input_ids"].shape[1]
            first = len(verify_seconds)
            started = time.perf_counter()
            decoding.generate(model, drafter, **inputs, max_new_tokens=args.max_new_tokens, do_sample=False,
                              num_drafts=4, lookup_tokens=10, cost_profile=profile)
            totals["loop"] += time.perf_counter() - started
            for seconds, (num_nodes, committed) in list(zip(verify_seconds, nodes))[first:]:
                if committed == 1:  # rounds that read no prompt
                    totals["verify"] += seconds
                    totals["verify_profile"] += float(profile.verifier_seconds(torch.tensor([1.0 + num_nodes]))[0])
                else:
                    totals["prompt_rounds"] += seconds
    totals["draft"] = sum(draft_seconds)
    totals["draft_profile"] = float(profile.drafter_seconds(torch.tensor(draft_lengths, dtype=torch.float64)).sum())
    report(totals, profile, nodes)


def report(totals: dict, profile, nodes: list):
    print(f"plain generate: {1000 * totals['plain'] / totals['plain_tokens']:.1f} ms/token; "
          f"profile's plain step {1000 * profile.plain_step:.1f} ms")
    print(f"tree rounds' verifier forwards: {totals['verify']:.2f} s measured, {totals['verify_profile']:.2f} s by the "
          f"profile ({totals['verify'] / totals['verify_profile']:.2f}x); mean nodes "
          f"{sum(n for n, _ in nodes) / len(nodes):.1f}")
    print(f"drafter calls: {totals['draft']:.2f} s measured, {totals['draft_profile']:.2f} s by the profile")
    rest = totals["loop"] - totals["verify"] - totals["prompt_rounds"] - totals["draft"]
    print(f"the loop's rest (host work): {rest:.2f} s of {totals['loop']:.2f} s, "
          f"{1000 * rest / len(nodes):.1f} ms per round over {len(nodes)} rounds")


if __name__ == "__main__":
    main()
