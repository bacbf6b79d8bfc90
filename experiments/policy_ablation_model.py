"""The shipped method's policies taken back one at a time, on `modeled_speedup.py`'s virtual clock (fp32, so every
variant writes plain greedy's text; each forward charged at a profile's price): `shipped`; `noskip` (the drafter
drafts every round, as before the loop could skip it); `oldlookup` (every lookup rank's prior 0.5 and no decay, as
at d17b1c6); `old` (both); `longdraft` (a round that drafts asks the drafter for its whole block, the tree budget
cutting it). The demo's prompts, then Spec-Bench 1 per category, 128 new tokens; resumable.

    python experiments/policy_ablation_model.py --profile P.json --variant shipped --variant old --out rows.jsonl
"""

import argparse
import contextlib
import json
import os
import sys
from pathlib import Path
from unittest import mock

from hf_specdiff import decoding, policies_specdiff

sys.path.insert(0, str(Path(__file__).parent))
from modeled_speedup import (LookupVariant, VirtualClock, add_run_arguments, install_clock, load_run,  # noqa: E402
                             read_profiles)

VARIANTS = ("shipped", "noskip", "oldlookup", "old", "longdraft")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", required=True, help="a cost profile's JSON file")
    parser.add_argument("--variant", action="append", required=True, choices=VARIANTS)
    add_run_arguments(parser, per_category=1)
    args = parser.parse_args()
    profile = list(read_profiles([args.profile]).values())[0]
    out, variants = args.out, args.variant
    model, tokenizer, drafter, rows = load_run(args)
    done = {(r["variant"], r["id"]) for r in map(json.loads, Path(out).read_text().splitlines())} \
        if os.path.exists(out) else set()
    state = {}
    next_length, lookup_rates = policies_specdiff.DraftLengthPolicy.next_length, decoding.lookup_acceptance_rates

    def ablated_next_length(self, allow_skip=False, allow_shadow=False):
        skip = not state["noskip"]
        length = next_length(self, allow_skip and skip, allow_shadow and skip)
        return self.max_length if state["longdraft"] and length and not self.probing else length

    def ablated_lookup_rates(drafter, max_length, first_prior):
        return lookup_rates(drafter, max_length, 0.5 if state["oldlookup"] else first_prior)

    clock = VirtualClock()
    with contextlib.ExitStack() as patches:
        install_clock(clock, drafter, patches)
        lookup = LookupVariant(patches)
        patches.enter_context(mock.patch.object(policies_specdiff.DraftLengthPolicy, "next_length",
                                                ablated_next_length))
        patches.enter_context(mock.patch.object(decoding, "lookup_acceptance_rates", ablated_lookup_rates))
        for prompt in rows:
            inputs = tokenizer.apply_chat_template([{"role": "user", "content": prompt["prompt"]}], return_tensors="pt",
                                                   add_generation_prompt=True, return_dict=True)
            prompt_len = inputs["input_ids"].shape[1]
            for variant in variants:
                if (variant, prompt["id"]) in done:
                    continue
                state.update(noskip=variant in ("noskip", "old"), oldlookup=variant in ("oldlookup", "old"),
                             longdraft=variant == "longdraft")
                lookup.select("pooled" if state["oldlookup"] else f"decay{decoding.LOOKUP_ACCEPTANCE_DECAY}")
                clock.profile, clock.seconds = profile, 0.0
                stats = decoding.SpecDiffStats()
                ids = decoding.generate(model, drafter, **inputs, max_new_tokens=args.max_new_tokens, do_sample=False, num_drafts=4,
                                        lookup_tokens=10, stats=stats, cost_profile=profile)
                tokens = ids.shape[1] - prompt_len
                row = dict(variant=variant, id=prompt["id"], category=prompt["category"],
                           speedup=tokens * profile.plain_step / clock.seconds, tau=stats.tau,
                           drafter_forwards=stats.drafter_forwards, rounds=stats.rounds)
                with open(out, "a") as file:
                    file.write(json.dumps(row) + "\n")
                print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
