"""Round costs on a machine slower (or faster) than its cost profile, on `modeled_speedup.py`'s virtual clock: the K=4 +
lookup loop's policies are priced by a profile P while the clock charges `--slowdown` S times P (every forward slowed
alike, as on a shared or throttled machine) plus `--overhead` seconds a round (host work, charged to plain decoding's
steps too). What `RoundCosts` learns from the rounds it times decides how it prices rounds it has not run:

- `additive`: the prior plus what rounds measured beyond it, averaged per kind (plain steps, drafting rounds) with 4
  rounds at zero (the code before this experiment);
- `ratio`: the prior times measured over prior seconds, per kind, averaged with 4 rounds at 1;
- `shipped`: `RoundCosts` as shipped (the prior times one slowdown over every round, plus what each kind adds).

fp32, so every variant writes plain greedy's text and the variants decide on the same text.

    python experiments/cost_drift_model.py --profile P.json --slowdown 1.5 --slowdown 0.67 [--overhead 0.002] \
        [--variant additive --variant ratio --variant shipped] [--per-category 1] --out rows.jsonl   (resumable)
    python experiments/cost_drift_model.py --summarize rows.jsonl
"""

import argparse
import contextlib
import json
import os
import sys
from pathlib import Path
from unittest import mock

import torch

from hf_specdiff import decoding
from hf_specdiff.costs_specdiff import CostProfile, RoundCosts
from modeled_speedup import VirtualClock, add_run_arguments, install_clock, load_run, speedup

VARIANTS = ("additive", "ratio", "shipped")


def additive_from_prior(costs: RoundCosts, lengths: torch.Tensor) -> torch.Tensor:
    prior = costs._prior_at(lengths)
    added = [(m - e) / (n + costs.prior_rounds)
             for m, e, n in zip(costs._measured, costs._expected, costs.rounds_by_kind)]
    return (prior + torch.where(torch.as_tensor(lengths) > 0, added[1], added[0])).clamp_min(0.1 * prior).float()


def ratio_from_prior(costs: RoundCosts, lengths: torch.Tensor) -> torch.Tensor:
    prior = costs._prior_at(lengths)
    ratio = [(n * m / e + costs.prior_rounds) / (n + costs.prior_rounds) if n else 1.0
             for m, e, n in zip(costs._measured, costs._expected, costs.rounds_by_kind)]
    return (prior * torch.where(torch.as_tensor(lengths) > 0, ratio[1], ratio[0])).float()


def select(variant: str, patches: contextlib.ExitStack):
    """Price rounds as `variant` does, until `patches` closes."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}: one of {', '.join(VARIANTS)}")
    if variant != "shipped":
        function = additive_from_prior if variant == "additive" else ratio_from_prior
        patches.enter_context(mock.patch.object(RoundCosts, "_from_prior", function))


def charged(profile: CostProfile, slowdown: float, overhead: float) -> CostProfile:
    """What the clock charges: `profile` slowed by `slowdown`, `overhead` added to every verifier forward."""
    return CostProfile({n: slowdown * s + overhead for n, s in profile.verifier.items()},
                       {g: slowdown * s for g, s in profile.drafter.items()})


def run_model(model, tokenizer, drafter, profile: CostProfile, slowdowns: list[float], overhead: float,
              variants: list[str], prompt_rows: list[dict], max_new_tokens: int, out: str):
    """Each prompt at each slowdown under each variant, a row each appended to `out` (rows already there kept)."""
    done = set()
    if os.path.exists(out):
        done = {(r["slowdown"], r["overhead"], r["variant"], r["id"])
                for r in map(json.loads, Path(out).read_text().splitlines())}
    clock = VirtualClock()
    with contextlib.ExitStack() as patches:
        install_clock(clock, drafter, patches)
        for prompt in prompt_rows:
            inputs = tokenizer.apply_chat_template([{"role": "user", "content": prompt["prompt"]}], return_tensors="pt",
                                                   add_generation_prompt=True, return_dict=True)
            prompt_len = inputs["input_ids"].shape[1]
            for slowdown, variant in [(s, v) for s in slowdowns for v in variants]:
                if (slowdown, overhead, variant, prompt["id"]) in done:
                    continue
                clock.profile, clock.seconds = charged(profile, slowdown, overhead), 0.0
                stats = decoding.SpecDiffStats()
                with contextlib.ExitStack() as variant_patches:
                    select(variant, variant_patches)
                    ids = decoding.generate(model, drafter, **inputs, max_new_tokens=max_new_tokens, do_sample=False,
                                            num_drafts=4, lookup_tokens=10, stats=stats, cost_profile=profile)
                new_tokens = ids.shape[1] - prompt_len
                row = {"slowdown": slowdown, "overhead": overhead, "variant": variant, "id": prompt["id"],
                       "category": prompt["category"], "new_tokens": new_tokens, "seconds": clock.seconds,
                       "plain_seconds": new_tokens * clock.profile.plain_step, "tau": stats.tau,
                       "tokens": ids[0, prompt_len:].tolist()}
                with open(out, "a") as file:
                    file.write(json.dumps(row) + "\n")
                print(f"{prompt['id']:>3} {prompt['category'][:8]:8} slowdown {slowdown} {variant:8} "
                      f"{row['plain_seconds'] / row['seconds']:.3f}x tau {stats.tau:.2f}", flush=True)


def summarize(path: str) -> str:
    """Modeled speed-up (plain seconds over the loop's, summed) per slowdown, overhead and variant: over the demo's
    prompts and over Spec-Bench's."""
    rows = [json.loads(line) for line in Path(path).read_text().splitlines()]
    groups: dict = {}
    for row in rows:
        groups.setdefault((row["slowdown"], row["overhead"], row["variant"]), []).append(row)

    lines = ["| slowdown | overhead | variant | demo | Spec-Bench | prompts |", "|---|---|---|---|---|---|"]
    for (slowdown, overhead, variant), selected in sorted(groups.items()):
        demo = [r for r in selected if r["category"] == "demo"]
        bench = [r for r in selected if r["category"] != "demo"]
        lines.append(f"| {slowdown} | {1000 * overhead:.1f} ms | {variant} | {speedup(demo):.3f}x | "
                     f"{speedup(bench):.3f}x | {len(selected)} |")
    return "\n".join(lines)


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--summarize":
        print(summarize(sys.argv[2]))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", required=True, help="a cost profile's JSON file")
    parser.add_argument("--slowdown", type=float, action="append", required=True)
    parser.add_argument("--overhead", type=float, default=0.0, help="seconds of host work a round")
    parser.add_argument("--variant", action="append", choices=VARIANTS)
    add_run_arguments(parser, per_category=1)
    args = parser.parse_args()
    profile = CostProfile.from_dict(json.loads(Path(args.profile).read_text()))
    model, tokenizer, drafter, prompt_rows = load_run(args)
    run_model(model, tokenizer, drafter, profile, args.slowdown, args.overhead, args.variant or list(VARIANTS),
              prompt_rows, args.max_new_tokens, args.out)
    print(summarize(args.out))


if __name__ == "__main__":
    main()
