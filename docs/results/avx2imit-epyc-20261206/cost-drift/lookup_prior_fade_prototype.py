"""Modeled: lookup acceptance with the prior's weight decayed like the counts (fade) vs shipped."""
import contextlib, json, sys, torch
from pathlib import Path
from unittest import mock
sys.path.insert(0, "experiments")
import modeled_speedup as ms
from hf_specdiff import decoding
from hf_specdiff.costs_specdiff import CostProfile
from hf_specdiff.policies_specdiff import AcceptanceRates
from hf_specdiff.tools.verifiers import DEFAULT_VERIFIER, load_pair

orig_rates, orig_update = AcceptanceRates.rates, AcceptanceRates.update
def fade_rates(self):
    if self.decay >= 1:
        return orig_rates(self)
    w = max(getattr(self, "_w", 1.0), 1e-6)
    rate, prior = [], self.first_prior
    for a, r in zip(self.accepted.tolist(), self.reached.tolist()):
        prior = (a + w * prior) / (r + w)
        rate.append(prior)
    return torch.tensor(rate)
def fade_update(self, num_drafted, num_accepted):
    if self.decay < 1:
        self._w = getattr(self, "_w", 1.0) * self.decay
    return orig_update(self, num_drafted, num_accepted)

torch.set_num_threads(1); torch.set_grad_enabled(False)
profiles = {Path(p).stem: CostProfile.from_dict(json.loads(Path(p).read_text())) for p in sys.argv[1].split(",")}
out = sys.argv[2]
model, tok, drafter = load_pair(DEFAULT_VERIFIER, None, dtype=torch.float32)
rows = ms.prompts(True, 1, "../shared/data/spec_bench/question.jsonl")
clock = ms.VirtualClock()
with contextlib.ExitStack() as patches:
    ms.install_clock(clock, drafter, patches)
    for row in rows:
        inputs = tok.apply_chat_template([{"role": "user", "content": row["prompt"]}], return_tensors="pt", add_generation_prompt=True, return_dict=True)
        L = inputs["input_ids"].shape[1]
        for pname, profile in profiles.items():
            for variant in ("shipped", "fade"):
                with contextlib.ExitStack() as vp:
                    if variant == "fade":
                        vp.enter_context(mock.patch.object(AcceptanceRates, "rates", fade_rates))
                        vp.enter_context(mock.patch.object(AcceptanceRates, "update", fade_update))
                    clock.profile, clock.seconds = profile, 0.0
                    st = decoding.SpecDiffStats()
                    ids = decoding.generate(model, drafter, **inputs, max_new_tokens=128, do_sample=False, num_drafts=4,
                                            lookup_tokens=10, stats=st, cost_profile=profile)
                n = ids.shape[1] - L
                r = {"profile": pname, "variant": variant, "id": row["id"], "category": row["category"], "new_tokens": n,
                     "seconds": clock.seconds, "plain_seconds": n * profile.plain_step, "tau": st.tau, "rounds": st.rounds}
                with open(out, "a") as f:
                    f.write(json.dumps(r) + "\n")
                print(row["id"], row["category"][:8], pname[:10], variant, f"{r['plain_seconds']/r['seconds']:.3f}x tau {st.tau:.2f}", flush=True)
