"""Verified against shadow probes, on `modeled_speedup.py`'s virtual clock: each path where drafting does not pay
probes now and then to keep measuring acceptance, either verifying one drafted token (`verified`: the loop before
shadow probes) or, greedy, drafting without verifying and comparing the draft with the tokens committed next where
the drafter's call costs less than a verified probe loses (`shadow`: as shipped). Paths: `k1` (`hf_specdiff.generate`,
one draft), `k4-lookup` (K=4 + the lookup branch, the shipped method) and `drop-in` (transformers' assisted loop with
the attached drafter; the clock charges its verifier forwards by the new tokens each reads).

fp32, so every row writes plain greedy's text and the two kinds decide on the same text; the profile prices and
charges every forward (`--profile`, any cost profile's JSON).

    python experiments/probe_kinds_model.py --profile P.json [--profile ...] [--path k1 --path k4-lookup \
        --path drop-in] [--per-category 1] --out rows.jsonl      (resumable: rows already in --out are kept)
    python experiments/probe_kinds_model.py --summarize rows.jsonl
"""

import argparse
import contextlib
import json
import os
import sys
from pathlib import Path
from unittest import mock

import torch

import hf_specdiff
from hf_specdiff import costs_specdiff
from hf_specdiff.costs_specdiff import CostProfile
from hf_specdiff.policies_specdiff import DraftLengthPolicy
from modeled_speedup import VirtualClock, add_run_arguments, install_clock, load_run, read_profiles, speedup

PATHS = ("k1", "k4-lookup", "drop-in")
KINDS = ("verified", "shadow")


def charge_drop_in_forwards(clock: VirtualClock, verifier, prompt_len: list[int]):
    """A forward hook charging each verifier forward of the drop-in path by its new tokens (the prompt's forward as a
    plain step plus the draft it verifies); a handle to remove."""
    def charge(_, args, kwargs, out):
        new_tokens = kwargs["input_ids"].shape[1]
        if getattr(out, costs_specdiff.CACHE_KWARG).get_seq_length() == new_tokens:  # the prompt's forward (its cache now filled)
            new_tokens = 1 + new_tokens - prompt_len[0]
        clock.charge(clock.profile.verifier_seconds(torch.tensor([float(new_tokens)]))[0])

    return verifier.register_forward_hook(charge, with_kwargs=True)


def generate(path: str, model, drafter, inputs: dict, max_new_tokens: int, profile: CostProfile):
    """One greedy generation on `path`; (ids, shadow probes where counted)."""
    settings = dict(max_new_tokens=max_new_tokens, do_sample=False)
    if path == "drop-in":
        costs_specdiff.set_cost_profile(model, drafter, profile)
        try:
            return model.generate(**inputs, **settings, assistant_model=drafter.attach(model)), None
        finally:
            drafter.detach()
    stats = hf_specdiff.SpecDiffStats()
    paths = {"k1": dict(num_drafts=1), "k4-lookup": dict(num_drafts=4, lookup_tokens=10)}
    ids = hf_specdiff.generate(model, drafter, **inputs, **settings, **paths[path], stats=stats, cost_profile=profile)
    return ids, stats.shadow_probes


def run_model(model, tokenizer, drafter, profiles: dict, paths: list[str], prompt_rows: list[dict],
              max_new_tokens: int, out: str):
    """Each prompt on each profile, path and probe kind, a row each appended to `out` (rows already there kept)."""
    done = set()
    if os.path.exists(out):
        done = {(r["profile"], r["path"], r["probes"], r["id"]) for r in map(json.loads, Path(out).read_text().splitlines())}
    clock, prompt_len = VirtualClock(), [0]
    with contextlib.ExitStack() as patches:
        install_clock(clock, drafter, patches)
        for prompt in prompt_rows:
            inputs = tokenizer.apply_chat_template([{"role": "user", "content": prompt["prompt"]}], return_tensors="pt",
                                                   add_generation_prompt=True, return_dict=True)
            prompt_len[0] = inputs["input_ids"].shape[1]
            for (profile_name, profile), path, kind in [(p, q, k) for p in profiles.items() for q in paths for k in KINDS]:
                if (profile_name, path, kind, prompt["id"]) in done:
                    continue
                clock.profile, clock.seconds = profile, 0.0
                with contextlib.ExitStack() as run:
                    if kind == "verified":
                        run.enter_context(mock.patch.object(DraftLengthPolicy, "_shadow_probe_pays", lambda self: False))
                    if path == "drop-in":
                        run.callback(charge_drop_in_forwards(clock, model, prompt_len).remove)
                    ids, shadow_probes = generate(path, model, drafter, inputs, max_new_tokens, profile)
                new_tokens = ids.shape[1] - prompt_len[0]
                row = {"profile": profile_name, "path": path, "probes": kind, "id": prompt["id"],
                       "category": prompt["category"], "new_tokens": new_tokens, "seconds": clock.seconds,
                       "plain_seconds": new_tokens * profile.plain_step, "shadow_probes": shadow_probes,
                       "tokens": ids[0, prompt_len[0]:].tolist()}
                with open(out, "a") as file:
                    file.write(json.dumps(row) + "\n")
                print(f"{prompt['id']:>3} {prompt['category'][:8]:8} {profile_name[:14]:14} {path:9} {kind:8} "
                      f"{row['plain_seconds'] / row['seconds']:.3f}x", flush=True)


def summarize(path: str) -> str:
    """Per profile, path and probe kind: modeled speed-up over the demo's prompts, over Spec-Bench's, and the worst
    single prompt."""
    rows = [json.loads(line) for line in Path(path).read_text().splitlines()]
    groups: dict = {}
    for row in rows:
        groups.setdefault((row["profile"], row["path"], row["probes"]), []).append(row)
    lines = ["| profile | path | probes | demo | Spec-Bench | worst prompt | prompts |", "|---|---|---|---|---|---|---|"]
    for (profile, path_name, kind), selected in groups.items():
        worst = min(selected, key=lambda r: r["plain_seconds"] / r["seconds"])
        lines.append(f"| {profile} | {path_name} | {kind} | "
                     f"{speedup([r for r in selected if r['category'] == 'demo']):.3f}x | "
                     f"{speedup([r for r in selected if r['category'] != 'demo']):.3f}x | "
                     f"{worst['category']} {worst['plain_seconds'] / worst['seconds']:.3f}x | {len(selected)} |")
    return "\n".join(lines)


def main():
    if sys.argv[1:2] == ["--summarize"]:
        print(summarize(sys.argv[2]))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", action="append", required=True, help="a cost profile's JSON file")
    parser.add_argument("--path", action="append", choices=PATHS)
    add_run_arguments(parser, per_category=1)
    args = parser.parse_args()
    model, tokenizer, drafter, prompt_rows = load_run(args)
    run_model(model, tokenizer, drafter, read_profiles(args.profile), args.path or list(PATHS), prompt_rows,
              args.max_new_tokens, args.out)


if __name__ == "__main__":
    main()
