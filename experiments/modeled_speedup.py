"""The tree loop on a virtual clock: each verifier forward and drafter call advances the clock by what a cost profile
says it costs on some machine, and the policies read that clock, so a lookup policy's speed-up on that machine is
modeled here, without that machine and without this shared machine's timing noise (its plain step moved 60-82 ms
within minutes). The verifier runs in fp32, where every variant writes plain greedy's text, so the variants decide on
the same text; the profile (any cached one: `~/.cache/hf_specdiff/costs/*.json`) sets the costs the policies size
trees by and the time each round is charged. Plain decoding is charged a plain step per token. What the model leaves
out (`round_cost_calibration.py`): the loop's host work (about 1.8 ms a round), the machine's speed moving from the
profile's, and bf16's own texts (a tree-masked forward costs what a chain does: `verifier_cost.py --tree`).

Variants of the K=4 + lookup loop's lookup acceptance: `pooled` (per-rank rates, every round weighed alike: the loop
before `LOOKUP_ACCEPTANCE_DECAY`), `decayG` (their counts multiplied by G before each update, so recent rounds weigh
more; the loop ships G = 0.8), `by-ngram` (per rank and per n-gram size the draft followed), `by-ngram-decayG`
(both).

    python experiments/modeled_speedup.py --profile P.json [--profile ...] --variant pooled --variant by-ngram \
        [--per-category 2] [--max-new-tokens 128] --out modeled.jsonl     (resumable: rows already in --out are kept)
    python experiments/modeled_speedup.py --summarize modeled.jsonl      (a markdown table: speed-up by profile and
        variant, over the demo's prompts, over Spec-Bench's, and its worst category)
"""

import argparse
import contextlib
import copy
import json
import os
import sys
import types
from pathlib import Path
from unittest import mock

import torch

from hf_specdiff import decoding, modeling_specdiff, policies_specdiff
from hf_specdiff.costs_specdiff import CostProfile
from hf_specdiff.policies_specdiff import LOOKUP_NGRAM, prompt_lookup_match
from hf_specdiff.tools.bench import read_spec_bench
from hf_specdiff.tools.demo import DEMO_PROMPTS
from hf_specdiff.tools.verifiers import DEFAULT_VERIFIER, load_pair


class VirtualClock:
    """`now()` for the loop's timers; `charge(seconds)` for each forward, priced by `profile`."""

    def __init__(self):
        self.seconds = 0.0
        self.profile: CostProfile | None = None

    def now(self, *_) -> float:
        return self.seconds

    def charge(self, seconds) -> None:
        self.seconds += float(seconds)


def install_clock(clock: VirtualClock, drafter, patches: contextlib.ExitStack):
    """Route the loop's timers to `clock`; charge verifier forwards (committed + tree tokens; the prompt's round as a
    plain step plus its tree) and drafter calls (tokens drafted) at the clock's profile. Undone when `patches` closes."""
    patches.enter_context(mock.patch.object(decoding, "time", types.SimpleNamespace(perf_counter=clock.now)))
    patches.enter_context(mock.patch.object(decoding, "device_clock", clock.now))
    patches.enter_context(mock.patch.object(policies_specdiff, "device_clock", clock.now))
    patches.enter_context(mock.patch.object(modeling_specdiff, "device_clock", clock.now))
    verify = decoding.TreeDecoding.verify

    def charged_verify(self, round_, cache):
        clock.charge(clock.profile.verifier_seconds(torch.tensor([1.0 + len(round_.tree)]))[0])
        return verify(self, round_, cache)

    patches.enter_context(mock.patch.object(decoding.TreeDecoding, "verify", charged_verify))
    draft = drafter.draft

    def charged_draft(input_ids, cache, num_tokens, *args, **kwargs):
        clock.charge(clock.profile.drafter_seconds(torch.tensor([num_tokens]))[0])
        return draft(input_ids, cache, num_tokens, *args, **kwargs)

    patches.enter_context(mock.patch.object(drafter, "draft", charged_draft))


class LookupVariant:
    """Installs one variant of the lookup branch's acceptance on `TreeDecoding` (see the module's docstring), undone
    when `patches` closes."""

    def __init__(self, patches: contextlib.ExitStack):
        self.ngram, self.by_ngram, self.decay = 0, False, 1.0
        prompt_lookup = decoding.prompt_lookup
        variant = self

        def lookup_with_ngram(ids, num_tokens, num_drafts=1, max_ngram=LOOKUP_NGRAM):
            variant.ngram = prompt_lookup_match(ids, max_ngram)[0]  # the n-gram size the drafts follow (0: none)
            return prompt_lookup(ids, num_tokens, num_drafts, max_ngram)

        def get_rates(tree_decoding):
            by_ngram = tree_decoding.__dict__["_lookup_by_ngram"]
            return by_ngram[variant.ngram if variant.by_ngram else 0]

        def set_rates(tree_decoding, rates):
            for r in rates:
                r.decay = variant.decay
            tree_decoding.__dict__["_lookup_by_ngram"] = {n: copy.deepcopy(rates) for n in range(LOOKUP_NGRAM + 1)}

        patches.enter_context(mock.patch.object(decoding, "prompt_lookup", lookup_with_ngram))
        patches.enter_context(mock.patch.object(decoding.TreeDecoding, "lookup_acceptance",
                                                property(get_rates, set_rates), create=True))

    @staticmethod
    def check(name: str) -> tuple[bool, float]:
        """(by n-gram size, decay) of variant `name`; a ValueError for an unknown one."""
        try:
            decay = float(name.rsplit("decay", 1)[1]) if "decay" in name else 1.0
        except ValueError:
            decay = None
        if name not in ("pooled", "by-ngram") and not (decay is not None and 0 < decay < 1 and
                                                      name.startswith(("decay", "by-ngram-decay"))):
            raise ValueError(f"unknown variant {name!r}: pooled, by-ngram, decayG, by-ngram-decayG (0 < G < 1)")
        return name.startswith("by-ngram"), decay

    def select(self, name: str):
        self.by_ngram, self.decay = self.check(name)


def prompts(demo: bool, per_category: int, spec_bench: str) -> list[dict]:
    rows = [{"id": f"d{i}", "category": "demo", "prompt": p} for i, p in enumerate(DEMO_PROMPTS)] if demo else []
    bench = read_spec_bench(spec_bench, per_category) if per_category else []
    return rows + [{"id": str(i), "category": r["category"], "prompt": r["prompt"]} for i, r in enumerate(bench)]


def run_modeled(model, tokenizer, drafter, profiles: dict, variants: list[str], prompt_rows: list[dict],
                max_new_tokens: int, out: str):
    """Each prompt under each profile and variant, a row each appended to `out` (rows already there are skipped)."""
    done = set()
    if os.path.exists(out):
        done = {(r["profile"], r["variant"], r["id"]) for r in map(json.loads, Path(out).read_text().splitlines())}
    clock = VirtualClock()
    with contextlib.ExitStack() as patches:
        install_clock(clock, drafter, patches)
        variant = LookupVariant(patches)
        for prompt in prompt_rows:
            inputs = tokenizer.apply_chat_template([{"role": "user", "content": prompt["prompt"]}], return_tensors="pt",
                                                   add_generation_prompt=True, return_dict=True)
            prompt_len = inputs["input_ids"].shape[1]
            for (profile_name, profile), name in [(p, v) for p in profiles.items() for v in variants]:
                if (profile_name, name, prompt["id"]) in done:
                    continue
                variant.select(name)
                clock.profile, clock.seconds = profile, 0.0
                stats = decoding.SpecDiffStats()
                ids = decoding.generate(model, drafter, **inputs, max_new_tokens=max_new_tokens, do_sample=False,
                                        num_drafts=4, lookup_tokens=10, stats=stats, cost_profile=profile)
                new_tokens = ids.shape[1] - prompt_len
                row = {"profile": profile_name, "variant": name, "id": prompt["id"], "category": prompt["category"],
                       "new_tokens": new_tokens, "seconds": clock.seconds, "plain_seconds": new_tokens * profile.plain_step,
                       "tau": stats.tau, "rounds": stats.rounds, "tokens": ids[0, prompt_len:].tolist()}
                with open(out, "a") as file:
                    file.write(json.dumps(row) + "\n")
                print(f"{prompt['id']:>3} {prompt['category'][:8]:8} {profile_name[:12]:12} {name:18} "
                      f"{row['plain_seconds'] / row['seconds']:.3f}x tau {stats.tau:.2f}", flush=True)


def speedup(rows: list[dict]) -> float:
    """Modeled speed-up of `rows`: plain seconds over the loop's, summed (nan for none)."""
    return sum(r["plain_seconds"] for r in rows) / sum(r["seconds"] for r in rows) if rows else float("nan")


def summarize(path: str) -> str:
    """Per profile and variant: modeled speed-up (plain seconds over the loop's, summed) over the demo's prompts,
    over Spec-Bench's, its worst category, and tau over all."""
    rows = [json.loads(line) for line in Path(path).read_text().splitlines()]
    groups: dict = {}
    for row in rows:
        groups.setdefault((row["profile"], row["variant"]), []).append(row)

    lines = ["| profile | variant | demo | Spec-Bench | worst category | tau (all) | prompts |", "|---|---|---|---|---|---|---|"]
    for (profile, name), selected in groups.items():
        bench = [r for r in selected if r["category"] != "demo"]
        by_category = {c: speedup([r for r in bench if r["category"] == c]) for c in {r["category"] for r in bench}}
        worst = min(by_category, key=by_category.get) if by_category else None
        tau = sum(r["new_tokens"] for r in selected) / sum(r["rounds"] for r in selected)
        lines.append(f"| {profile} | {name} | {speedup([r for r in selected if r['category'] == 'demo']):.3f}x | "
                     f"{speedup(bench):.3f}x | " + (f"{worst} {by_category[worst]:.3f}x" if worst else "-") +
                     f" | {tau:.2f} | {len(selected)} |")
    return "\n".join(lines)


def read_profiles(paths: list[str]) -> dict[str, CostProfile]:
    """Cost profiles from their JSON files, by file name without the extension."""
    return {Path(path).stem: CostProfile.from_dict(json.loads(Path(path).read_text())) for path in paths}


def load_run(args: argparse.Namespace) -> tuple:
    """(verifier, tokenizer, drafter, prompt rows) of a modeled run from `add_run_arguments`' options: the models in
    fp32 (every variant writes plain greedy's text), torch's threads set."""
    torch.set_num_threads(args.threads)
    model, tokenizer, drafter = load_pair(args.verifier, args.drafter, dtype=torch.float32)
    return model, tokenizer, drafter, prompts(args.demo, args.per_category, args.spec_bench)


def add_run_arguments(parser: argparse.ArgumentParser, per_category: int):
    """The models, prompts, length, threads and output file of a modeled run."""
    parser.add_argument("--verifier", default=DEFAULT_VERIFIER)
    parser.add_argument("--drafter", help="a drafter folder (default: the one shipped for --verifier)")
    parser.add_argument("--demo", action=argparse.BooleanOptionalAction, default=True, help="the demo's prompts too")
    parser.add_argument("--per-category", type=int, default=per_category)
    parser.add_argument("--spec-bench", default="../shared/data/spec_bench/question.jsonl")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", required=True)


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--summarize":
        print(summarize(sys.argv[2]))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", action="append", required=True, help="a cost profile's JSON file")
    parser.add_argument("--variant", action="append", required=True)
    add_run_arguments(parser, per_category=2)
    args = parser.parse_args()
    profiles = read_profiles(args.profile)
    for name in args.variant:
        LookupVariant.check(name)
    model, tokenizer, drafter, prompt_rows = load_run(args)
    run_modeled(model, tokenizer, drafter, profiles, args.variant, prompt_rows, args.max_new_tokens, args.out)


if __name__ == "__main__":
    main()
