"""What speculative decoding can gain on this machine, read off its cost profiles (`hf-specdiff doctor`), and the
dtype that `--dtype auto` picks for the demo, bench and examples."""

from dataclasses import dataclass

import torch

from ..costs_specdiff import CostProfile, machine_description
from ..policies_specdiff import AcceptanceRates
from .threads import torch_threads
from .verifiers import load_pair

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
# the acceptance the policies assume of a drafter before measuring it: its first position half the time, each later
# one as often as the one before it (`AcceptanceRates`' prior)
PRIOR_ACCEPTANCE = AcceptanceRates(1).first_prior
ACCEPTANCE_LEVELS = (0.3, 0.5, 0.7, 0.9)


@dataclass
class Outlook:
    """One dtype's cost profile and what it lets speculative decoding gain, for drafts whose every position is
    accepted with probability p once the ones before it were."""

    dtype_name: str
    profile: CostProfile
    max_length: int

    @property
    def plain_rate(self) -> float:
        """Tokens per second of plain decoding."""
        return 1.0 / self.profile.plain_step

    def best(self, p: float, drafted: bool = True) -> tuple[int, float]:
        """(draft length, tokens per second) of the best round: the drafter's draft, or with `drafted=False` a
        prompt-lookup draft (no drafter call). Length 0 is a plain step."""
        return self.profile.best_rate(torch.full((self.max_length,), p), self.max_length, drafted)

    def speedup(self, p: float, drafted: bool = True) -> float:
        return self.best(p, drafted)[1] / self.plain_rate

    def break_even(self, drafted: bool = True) -> float | None:
        """The least acceptance p (in steps of 0.05) at which drafting beats plain steps; None: not even at 0.95."""
        return next((p / 100 for p in range(5, 100, 5) if self.best(p / 100, drafted)[0] > 0), None)

    @property
    def method_rate(self) -> float:
        """Expected tokens per second of the whole method at the prior acceptance: plain, drafted or looked up,
        whichever the profile says pays."""
        return max(self.best(PRIOR_ACCEPTANCE)[1], self.best(PRIOR_ACCEPTANCE, drafted=False)[1])


def measure_outlooks(verifier: str, drafter: str | None, dtype_names=tuple(DTYPES), threads: int | None = 2,
                     device: str | None = None, fresh: bool = False) -> list[Outlook]:
    """Load `verifier` and `drafter` (None: the shipped one) in each dtype and read its cost profile (measured once
    per machine, then cached; measured again with `fresh`)."""
    with torch_threads(threads):
        return [outlook for outlook, _ in _loaded_outlooks(verifier, drafter, dtype_names, device, fresh)]


def _loaded_outlooks(verifier: str, drafter: str | None, dtype_names, device: str | None, fresh: bool = False):
    """(outlook, (verifier, tokenizer, drafter)) for each dtype, loaded in turn."""
    for name in dtype_names:
        models = load_pair(verifier, drafter, DTYPES[name], device=device)
        profile = models[2].cost_profile(models[0], fresh=fresh)
        yield Outlook(name, profile, models[2].config.max_draft_tokens), models


def fastest(outlooks: list[Outlook]) -> Outlook:
    """The outlook whose whole method (plain or speculative, whichever its profile says wins) is fastest."""
    return max(outlooks, key=lambda outlook: outlook.method_rate)


def choose_dtype(verifier: str, drafter: str | None, threads: int | None = 2, device: str | None = None) -> str:
    """`--dtype auto`: the dtype name in which the method is fastest on this machine, said on stdout."""
    outlooks = measure_outlooks(verifier, drafter, threads=threads, device=device)
    return _say_choice(outlooks, fastest(outlooks)).dtype_name


def load_fastest(verifier: str, drafter: str | None, threads: int | None = 2, device: str | None = None):
    """`--dtype auto` for a caller that runs the models: (verifier, tokenizer, drafter) in the dtype `choose_dtype`
    picks, each dtype loaded once and the chosen one kept."""
    outlooks, chosen = [], None
    with torch_threads(threads):
        for outlook, models in _loaded_outlooks(verifier, drafter, tuple(DTYPES), device):
            outlooks.append(outlook)
            if chosen is None or outlook.method_rate > chosen[0].method_rate:
                chosen = outlook, models
            del models
    _say_choice(outlooks, chosen[0])
    return chosen[1]


def _say_choice(outlooks: list[Outlook], chosen: Outlook) -> Outlook:
    rates = ", ".join(f"{o.dtype_name} {o.method_rate:.1f}" for o in outlooks)
    print(f"--dtype auto: {chosen.dtype_name} (expected tokens/s on this machine's cost profile: {rates}; "
          "`hf-specdiff doctor` explains)")
    return chosen


def report(outlooks: list[Outlook]) -> str:
    """The doctor's text: the machine, each dtype's costs, the speed-up to expect, what the defaults will do."""
    machine = outlooks[0].profile.machine or machine_description(torch.device("cpu"))
    lines = [f"machine: {machine.get('processor')}, {machine.get('cpu_capability')}, {machine.get('threads')} "
             f"threads, torch {machine.get('torch')}" + (f", {machine['accelerator']}" if "accelerator" in machine
                                                        else ""), ""]
    lines += _cost_table(outlooks) + [""] + _kernels(outlooks) + _speedup_table(outlooks) + [""] + _defaults(outlooks)
    return "\n".join(lines)


def _kernels(outlooks: list[Outlook]) -> list[str]:
    """What the profiles' kernel choice (`CostProfile.kernels_chosen`) gains, and how a user's own calls get it;
    nothing where no profile chose."""
    lines = []
    for o in outlooks:
        if not o.profile.chooses_kernels:
            continue
        default = o.profile.torch_plain_step
        lines.append(f"{o.dtype_name}: {o.profile.kernels_chosen()} here (a plain step "
                     f"{1000 * o.profile.plain_step:.1f} ms against {1000 * default:.1f} ms as torch runs it), and "
                     "hf_specdiff's loop runs them so, as does `assistant_model=drafter` once `drafter.attach(model)` "
                     f"paired them. Plain `generate` gets the same {default / o.profile.plain_step:.2f}x inside "
                     "`with drafter.cost_profile(model).verifier_kernels(model):`; the costs above and the speed-ups "
                     "below are with them.")
    return lines + [""] if lines else []


def _cost_table(outlooks: list[Outlook]) -> list[str]:
    counts = [n for n in (2, 4, 8, 16) if n <= max(max(o.profile.verifier) for o in outlooks)]
    lines = ["what a round costs (a verifier forward over n new tokens, in plain steps; the drafter's call in ms):",
             f"{'dtype':6s} {'plain step':>10s} " + " ".join(f"{f'n={n}':>6s}" for n in counts) + "   drafter call"]
    for o in outlooks:
        relative = o.profile.verifier_seconds(torch.tensor(counts, dtype=torch.float64)) / o.profile.plain_step
        drafter = ", ".join(f"{1000 * s:.1f} ms ({g} token{'s' if g > 1 else ''})" for g, s in sorted(o.profile.drafter.items()))
        lines.append(f"{o.dtype_name:6s} {1000 * o.profile.plain_step:7.1f} ms " +
                     " ".join(f"{float(r):5.2f}x" for r in relative) + f"   {drafter or 'not measured'}")
    return lines


def _speedup_table(outlooks: list[Outlook]) -> list[str]:
    lines = ["speed-up over plain decoding in the same dtype to expect, if each drafted position is accepted with "
             "probability p once the ones before it were (best draft length in brackets; 1.00x [0]: plain steps):",
             f"{'dtype':6s} {'source':14s} " + " ".join(f"{f'p={p}':>11s}" for p in ACCEPTANCE_LEVELS)]
    for o in outlooks:
        for source, drafted in (("drafter", True), ("prompt lookup", False)):
            cells = [f"{o.speedup(p, drafted):5.2f}x [{o.best(p, drafted)[0]:2d}]" for p in ACCEPTANCE_LEVELS]
            lines.append(f"{o.dtype_name:6s} {source:14s} " + " ".join(f"{c:>11s}" for c in cells))
    return lines


def _defaults(outlooks: list[Outlook]) -> list[str]:
    best = fastest(outlooks)
    lines = [f"--dtype auto picks {best.dtype_name}: expected {best.method_rate:.1f} tokens/s against " +
             ", ".join(f"{o.dtype_name} {o.method_rate:.1f}" for o in outlooks if o is not best) +
             " (plain or speculative, whichever pays, at the acceptance an untried drafter is given, "
             f"p={PRIOR_ACCEPTANCE}). A model you load yourself keeps its dtype."]
    for o in outlooks:
        length, rate = o.best(PRIOR_ACCEPTANCE)
        lookup, _ = o.best(PRIOR_ACCEPTANCE, drafted=False)
        first = (f"the drafter drafts {length} token{'s' if length != 1 else ''} a round" if length else
                 "plain steps, the drafter called only for a probe now and then (even at p="
                 f"{PRIOR_ACCEPTANCE} its draft costs more than it brings)")
        lines.append(f"{o.dtype_name}: from the first round, {first}; prompt-lookup drafts of up to {lookup} "
                     f"token{'s' if lookup != 1 else ''} where the context repeats itself; then both follow the acceptance they measure.")
    return lines
