"""The shipped method (K=4 + lookup, greedy) of this checkout against an earlier commit's, on the wall clock, with
where each spends its time: verifier forwards (how many, how many tree nodes each, their milliseconds), drafter
calls, and the rest (the loop's host work). One process, methods interleaved per prompt (order reversed every other
run), plain decoding beside them; the profile is measured before the first prompt, so no method pays for it. Rows are
JSON lines on stdout, then the median forward's milliseconds by tree size per method. Variants of this checkout:
`learned-tree-costs` (trees priced by what their rounds measured, from nothing, as before the cost profile) and
`sloped-tree-costs` (the profile's prices plus a measured excess that grows with the length, not one amount for
every length), `new-with-profile` (priced by `--profile` instead of this machine's cached one). Usage (d17b1c6 needs transformers 5.23):

    python experiments/tree_loop_vs_commit.py d17b1c6 --dtype bf16 --repeats 2 > rows.jsonl
    python experiments/tree_loop_vs_commit.py d17b1c6 --methods plain,old,new,learned-tree-costs --prompts 0,8,9
    python experiments/tree_loop_vs_commit.py --summarize rows.jsonl   (speed-up, tau, nodes; each method per prompt
        against `old`: the geometric mean of its speed ratio, prompts where it is faster)
"""

import argparse
import collections
import importlib
import json
import math
import statistics
import sys
import time
from pathlib import Path
from unittest import mock

import torch

import hf_specdiff
from hf_specdiff.costs_specdiff import CostProfile, RoundCosts, cost_profile
from hf_specdiff.modeling_specdiff import SpecDiffDrafter
from hf_specdiff.tools.bench import read_spec_bench
from hf_specdiff.tools.doctor import DTYPES
from hf_specdiff.tools.shipped import shipped_drafter_path
from hf_specdiff.tools.verifiers import load_verifier

sys.path.insert(0, str(Path(__file__).parent))
from sampling_vs_commit import package_at  # noqa: E402


class ForwardTimer:
    """Seconds and calls of a module's forwards; for the verifier also the new tokens of each (`log`)."""

    def __init__(self, module):
        self.seconds, self.calls, self.log, self._start, self._tokens = 0.0, 0, [], 0.0, 0
        module.register_forward_pre_hook(self._pre, with_kwargs=True)
        module.register_forward_hook(self._post)

    def _pre(self, module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        self._tokens = 0 if ids is None else ids.shape[1]
        self._start = time.perf_counter()

    def _post(self, *_):
        elapsed = time.perf_counter() - self._start
        self.seconds += elapsed
        self.calls += 1
        self.log.append((self._tokens, elapsed))

    def reset(self):
        self.seconds, self.calls, self.log = 0.0, 0, []


def sloped_from_prior(self, lengths):
    """`RoundCosts._from_prior` with a drafting round's measured excess over the prior fitted as a line in the length
    (weighted by rounds, shrunk by n / (n + prior_rounds)), not one mean for every length."""
    slowdown = self.slowdown
    plain = (self._measured[0] - slowdown * self._expected[0]) / (self.rounds_by_kind[0] + self.prior_rounds)
    intercept = slope = 0.0
    drafted = sorted(g for g in self.rounds if g > 0)
    if drafted:
        g = torch.tensor(drafted, dtype=torch.float64)
        n = torch.tensor([self.rounds[k] for k in drafted], dtype=torch.float64)
        excess = torch.tensor([self.seconds[k] for k in drafted], dtype=torch.float64) / n - slowdown * self._prior_at(g)
        g_bar, excess_bar = (n * g).sum() / n.sum(), (n * excess).sum() / n.sum()
        spread = (n * (g - g_bar) ** 2).sum()
        slope = float((n * (g - g_bar) * (excess - excess_bar)).sum() / spread) if spread > 0 else 0.0
        shrink = float(n.sum() / (n.sum() + self.prior_rounds))
        intercept, slope = shrink * float(excess_bar - slope * g_bar), shrink * slope
    lengths = torch.as_tensor(lengths)
    added = torch.where(lengths > 0, intercept + slope * lengths.double(), plain)
    return (slowdown * self._prior_at(lengths) + added).clamp_min(0.1 * self._prior_at(lengths)).float()


def patched(generate, patch):
    def run(inputs):
        with patch:
            return generate(inputs)
    return run


def make_methods(verifier, drafter, drafter_then, loop_then, max_new_tokens: int, other_profile) -> dict:
    """name -> (generate(inputs), which drafter's timer counts its calls)."""
    shipped = dict(do_sample=False, max_new_tokens=max_new_tokens, num_drafts=4, lookup_tokens=10)
    new = lambda x: hf_specdiff.generate(verifier, drafter, **x, **shipped)  # noqa: E731
    return {
        "plain": (lambda x: verifier.generate(**x, do_sample=False, max_new_tokens=max_new_tokens), "new"),
        "old": (lambda x: loop_then.generate(verifier, drafter_then, **x, **shipped), "old"),
        "new": (new, "new"),
        "learned-tree-costs": (patched(new, mock.patch.object(SpecDiffDrafter, "new_round_costs",
                                                              staticmethod(lambda profile: RoundCosts()))), "new"),
        "sloped-tree-costs": (patched(new, mock.patch.object(RoundCosts, "_from_prior", sloped_from_prior)), "new"),
        "new-with-profile": (lambda x: hf_specdiff.generate(verifier, drafter, **x, **shipped,
                                                            cost_profile=other_profile), "new"),
    }


def timed_run(generate, inputs: dict, verifier_timer: ForwardTimer, drafter_timer: ForwardTimer | None) -> dict:
    """One generation: speed, tau, verifier forwards (tree nodes each, ms), drafter calls and ms, the rest a round."""
    verifier_timer.reset()
    if drafter_timer is not None:
        drafter_timer.reset()
    start = time.perf_counter()
    tokens = generate(inputs).shape[1] - inputs["input_ids"].shape[1]
    seconds = time.perf_counter() - start
    calls = verifier_timer.calls
    drafter_seconds = drafter_timer.seconds if drafter_timer is not None else 0.0
    return {"tok_s": round(tokens / seconds, 2), "tau": round(tokens / calls, 3), "fwd": calls,
            "nodes_per_fwd": round(sum(n for n, _ in verifier_timer.log[1:]) / max(calls - 1, 1), 2),
            "v_ms": round(1000 * verifier_timer.seconds / calls, 1),
            "d_calls": drafter_timer.calls if drafter_timer is not None else 0, "d_ms": round(1000 * drafter_seconds),
            "host_ms_per_round": round(1000 * (seconds - verifier_timer.seconds - drafter_seconds) / calls, 2),
            "total_s": round(seconds, 3)}


def summarize(path: str) -> str:
    rows = [json.loads(line) for line in open(path) if line.startswith("{")]
    totals = collections.defaultdict(lambda: [0.0, 0.0, 0, 0.0])  # tokens, seconds, forwards, nodes
    rates = collections.defaultdict(lambda: collections.defaultdict(list))  # method -> prompt -> tok/s of each run
    for row in rows:
        total = totals[row["m"]]
        total[0] += row["tok_s"] * row["total_s"]
        total[1] += row["total_s"]
        total[2] += row["fwd"]
        total[3] += row["nodes_per_fwd"] * row["fwd"]
        rates[row["m"]][row["i"]].append(row["tok_s"])
    plain = totals["plain"][0] / totals["plain"][1]
    lines = ["| method | tok/s | speed-up | tau | nodes a forward | per prompt against old | faster on |",
             "|---|---|---|---|---|---|---|"]
    for name, (tokens, seconds, forwards, nodes) in totals.items():
        ratios = [statistics.mean(rates[name][i]) / statistics.mean(rates["old"][i]) for i in rates[name]
                  if "old" in rates and i in rates["old"]]
        against = f"{math.exp(statistics.mean(map(math.log, ratios))):.3f}x" if ratios and name != "old" else ""
        faster = f"{sum(r > 1 for r in ratios)} of {len(ratios)}" if against else ""
        lines.append(f"| {name} | {tokens / seconds:.1f} | {tokens / seconds / plain:.3f}x | {tokens / forwards:.2f} | "
                     f"{nodes / forwards:.2f} | {against} | {faster} |")
    return "\n".join(lines)


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--summarize":
        print(summarize(sys.argv[2]))
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("commit")
    parser.add_argument("--verifier", default="smollm2-135m-instruct")
    parser.add_argument("--drafter", help="a drafter folder (default: the shipped one)")
    parser.add_argument("--spec-bench", default="../shared/data/spec_bench/question.jsonl")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    parser.add_argument("--per-category", type=int, default=2)
    parser.add_argument("--prompts", help="comma-separated indices into the Spec-Bench prompts read (default: all)")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--methods", default="plain,old,new")
    parser.add_argument("--profile", help="a cost profile's JSON file, which the method `new-with-profile` is priced by")
    args = parser.parse_args()
    torch.set_num_threads(2)
    dtype = DTYPES[args.dtype]
    verifier, tokenizer = load_verifier(args.verifier, dtype=dtype)
    earlier = package_at(args.commit)
    drafter_path = args.drafter or shipped_drafter_path()
    drafter = SpecDiffDrafter.from_pretrained(drafter_path, dtype=dtype).eval()
    drafter_then = importlib.import_module(f"{earlier.__name__}.modeling_specdiff").SpecDiffDrafter.from_pretrained(
        drafter_path, dtype=dtype).eval()
    cost_profile(verifier, drafter)  # measured now, if this machine has none, not inside a timed generation
    if (Path(earlier.__file__).parent / "costs_specdiff.py").exists():  # the earlier loop's own, where it has one
        importlib.import_module(f"{earlier.__name__}.costs_specdiff").cost_profile(verifier, drafter_then)
    timers = {"verifier": ForwardTimer(verifier), "new": ForwardTimer(drafter), "old": ForwardTimer(drafter_then)}
    loop_then = importlib.import_module(f"{earlier.__name__}.decoding")
    other_profile = CostProfile.from_dict(json.loads(Path(args.profile).read_text())) if args.profile else None
    methods = make_methods(verifier, drafter, drafter_then, loop_then, args.max_new_tokens, other_profile)
    prompts = read_spec_bench(args.spec_bench, args.per_category)
    indices = list(map(int, args.prompts.split(","))) if args.prompts else range(len(prompts))
    forwards = {}
    for index in indices:
        inputs = tokenizer.apply_chat_template([{"role": "user", "content": prompts[index]["prompt"]}],
                                               add_generation_prompt=True, return_tensors="pt", return_dict=True)
        for repeat in range(args.repeats):
            for name in args.methods.split(",")[:: 1 if (repeat + index) % 2 == 0 else -1]:
                generate, drafter_name = methods[name]
                row = timed_run(generate, inputs, timers["verifier"], timers[drafter_name] if name != "plain" else None)
                print(json.dumps({"i": index, "cat": prompts[index]["category"], "m": name, **row}), flush=True)
                forwards.setdefault(name, []).extend(timers["verifier"].log[1:])  # the prompt's forward left out
    for name, log in forwards.items():
        by_size = {f"{lo}-{hi}": [s for n, s in log if lo <= n <= hi]
                   for lo, hi in [(1, 1), (2, 3), (4, 6), (7, 10), (11, 16), (17, 40)]}
        print(name, "median forward ms by tokens (forwards):",
              {size: (len(s), round(1000 * statistics.median(s), 1)) for size, s in by_size.items() if s}, flush=True)

if __name__ == "__main__":
    main()
