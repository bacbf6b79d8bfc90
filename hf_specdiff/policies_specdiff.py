"""How long a draft each round proposes: `AcceptanceRates` measured in this generation, `DraftLengthPolicy` (the
length, 0 for a plain step, with the most expected tokens per second on this machine's `RoundCosts`), and
`AssistantRounds`, what a drafter called by transformers' assisted loop learns between calls (and where it proposes
prompt lookup's draft instead).

This file ships to the Hub as remote code: it imports only torch and transformers.
"""

import torch

from .costs_specdiff import RoundCosts, device_clock


class AcceptanceRates:
    """Per draft position i, the rate a_i at which position i is accepted once every position before it was:
    (accepted_i + a_{i-1}) / (reached_i + 1), a_0 = `first_prior`. One pseudo-observation each: an untried first
    position counts as accepted half the time, a later position as doing as well as the one before it, so a position
    reached only a few times is not taken for one that is always accepted (which made long drafts look worth trying
    after every new prompt), and a first round does not verify a long draft nothing is known of (with a prior of 1,
    it verified 16 tokens, 6 plain steps' time where verified tokens are dear).

    With `decay` < 1 the counts are multiplied by it before each update, so the last 1 / (1 - decay) rounds or so
    weigh the most: for drafts whose acceptance moves with the text (a prompt-lookup draft is accepted while the
    output copies a passage and rejected once it stops)."""

    def __init__(self, max_length: int, first_prior: float = 0.5, decay: float = 1.0):
        if not 0 < decay <= 1:
            raise ValueError(f"decay must be in (0, 1], got {decay}")
        self.reached = torch.zeros(max_length)
        self.accepted = torch.zeros(max_length)
        self.first_prior = first_prior
        self.decay = decay

    def rates(self) -> torch.Tensor:
        rate, prior = [], self.first_prior
        for accepted, reached in zip(self.accepted.tolist(), self.reached.tolist()):
            prior = (accepted + prior) / (reached + 1)
            rate.append(prior)
        return torch.tensor(rate)

    def update(self, num_drafted: int, num_accepted: int):
        if self.decay < 1:
            self.reached *= self.decay
            self.accepted *= self.decay
        reached = min(num_accepted + 1, num_drafted)
        self.reached[:reached] += 1
        self.accepted[:num_accepted] += 1


class DraftLengthPolicy:
    """Picks the draft length g <= max_length that maximises expected tokens per round, 1 + sum_{m<=g} prod_{i<=m}
    a_i (`AcceptanceRates`), over the measured cost of a round of that length (`RoundCosts`): long drafts where the
    drafter is accepted and verifying more tokens is cheap, short ones where it is rejected or verifying is dear.
    `fixed` pins the length.

    A policy lives one generation: its acceptance is what this generation measured (from a prior that an untried
    first position is accepted half the time); its costs start from this machine's `CostProfile` where one is given.

    A loop that can run a round without a draft (a plain step) asks `next_length(allow_skip=True)`: it may get 0,
    except for a probe round, which drafts 1 token so that acceptance keeps being measured. The first probe comes
    after `probe_every` skipped rounds; each probe after which drafting still does not pay doubles the gap, up to
    `max_probe_every` (a probe costs more than it brings, or it would not be skipping); a drafting round brings the
    gap back to `probe_every`. While it skips, the decision stands until a round drafts (a probe): a skipped round
    adds only a plain step's time, which hardly moves it, and weighing every length costs about 0.3 ms, a few tenths
    of a percent of a step. A loop that cut the whole draft it asked for says so (`decline`): that counts as a skip.

    A greedy loop may take a shadow probe instead (`next_length(allow_skip=True, allow_shadow=True)`): where the
    drafter's call (`draft_seconds`) costs less than a verified probe loses, the probe round is a plain step and
    `shadow_probe` asks for a one-token draft that nobody verifies; the loop hands its token(s) to `shadowed` and the
    token it commits next to `update_shadow`, which counts the probe accepted if that token was drafted: the probe's
    measurement, without the verifier's cost.

    Without a profile, while it drafts, such a loop takes a plain step now and then to measure what one costs (every
    `probe_every`-th round until `plain_samples` are measured, then every `plain_every`-th): without that, a plain
    step's cost is the drafting rounds' line at g = 0, which still holds the drafter's forward and its round's
    overhead, so skipping looked dearer than it is and a drafter that barely paid kept drafting."""

    probe_every = 8
    max_probe_every = 64
    plain_samples = 4
    plain_every = 64

    def __init__(self, max_length: int, fixed: int | None = None, prior_slope: float = 0.02,
                 costs: RoundCosts | None = None, draft_seconds=None):
        self.max_length = max_length
        self.fixed = fixed
        self.acceptance = AcceptanceRates(max_length)
        self.costs = costs if costs is not None else RoundCosts(prior_slope)
        self.draft_seconds = draft_seconds  # g -> seconds of a drafter call drafting g tokens (None: unknown)
        self.shadow_probe = False  # the last decision was a shadow probe: draft one token, verify nothing
        self.shadow_tokens: list[int] | None = None  # a shadow probe's drafted token(s), until the next is committed
        self.skipped = 0
        self.probe_gap = self.probe_every
        self.skipping = False  # the last decision with allow_skip was 0, and nothing has drafted since
        self.probing = False  # the last decision was a probe: its token is to be verified, whatever it costs
        self.since_plain = 0  # rounds that could have skipped and drafted, since the last plain step

    def next_length(self, allow_skip: bool = False, allow_shadow: bool = False) -> int:
        self.probing, self.shadow_probe = False, False
        if self.fixed is not None:
            return self.fixed
        if not (allow_skip and self.skipping):
            best = self.best(allow_skip)[0]
            if best and allow_skip and self._measure_plain_step():
                return 0
            if best:
                self.skipped = 0
                return best
            self.skipping = True
        self.skipped += 1
        if self.skipped < self.probe_gap:
            return 0
        self.skipped, self.probe_gap = 0, min(2 * self.probe_gap, self.max_probe_every)
        self.shadow_probe = allow_shadow and self._shadow_probe_pays()
        if self.shadow_probe:
            return 0
        self.probing = True
        return 1

    def _shadow_probe_pays(self) -> bool:
        """Whether a shadow probe of one token loses less than a verified one. A verified probe costs a round
        of length 1 and brings 1 + (the first position's acceptance) tokens, a plain step's worth each; a shadow probe
        costs the drafter's call. One token, as a verified probe: both measure the first position alone, so the
        decisions after either are the same. (Shadow drafts of 7 tokens, every position measured from one draft, made
        one unlucky draft stop the drafter on the demo's code edit where verified probes had found it paying.)"""
        if self.draft_seconds is None:
            return False
        cost = self.costs.predict(torch.tensor([0, 1]))
        verified_loss = float(cost[1] - (1 + self.acceptance.rates()[0]) * cost[0])
        shadow_loss = self.costs.slowdown * float(self.draft_seconds(torch.tensor([1]))[0])
        return shadow_loss < verified_loss

    def _measure_plain_step(self) -> bool:
        """Whether this round, which would draft, is a plain step taken to measure one (never with a cost prior,
        which knows it)."""
        if self.costs.prior is not None:
            return False
        self.since_plain += 1
        measured = self.costs.rounds.get(0, 0) >= self.plain_samples
        if self.since_plain < (self.plain_every if measured else self.probe_every):
            return False
        self.since_plain = 0
        return True

    def best(self, allow_skip: bool = False) -> tuple[int, float]:
        """The draft length with the most expected tokens per unit of measured round cost (0 only if `allow_skip`),
        and that rate: in tokens per second once a drafting round was timed (`timed`)."""
        lengths = torch.arange(0 if allow_skip else 1, self.max_length + 1)
        rate = self.tokens_per_second(lengths)
        return int(lengths[rate.argmax()]), float(rate.max())

    def tokens_per_second(self, lengths: torch.Tensor) -> torch.Tensor:
        """Expected tokens of a round drafting each of `lengths`, over its predicted cost."""
        expected = 1 + torch.cat([torch.zeros(1), self.acceptance.rates().cumprod(0)]).cumsum(0)[lengths]
        return expected / self.costs.predict(lengths)

    @property
    def timed(self) -> bool:
        """Whether costs are in seconds: a cost prior, or a round that drafted was timed (until then costs, and
        rates, are relative)."""
        return self.costs.prior is not None or any(length > 0 for length in self.costs.rounds)

    def decline(self):
        """The round verified none of the draft this policy asked for (a tree budget judged its tokens too unlikely to
        pay for verifying them): skip until the next probe, as if `next_length` had said 0, the probes' gap kept.
        Otherwise a drafter whose drafts were always cut paid its forward every round and learnt nothing."""
        self.skipping, self.skipped = True, 0

    def shadowed(self, tokens: list[int]):
        """Call after drafting a shadow probe's token: `tokens`, as many as a verified probe would have offered (a
        tree loop's K likeliest)."""
        self.shadow_tokens = tokens

    def update_shadow(self, next_token: int):
        """Call with the first token a loop commits after a shadow probe's context (no-op without a probe pending):
        the probe counts as accepted if it drafted that token, and the next round weighs the lengths again, as after
        a verified probe (whose doubled gap stands)."""
        if self.shadow_tokens is not None:
            self.acceptance.update(1, int(next_token in self.shadow_tokens))
            self.shadow_tokens, self.skipping = None, False

    def update(self, num_drafted: int, num_accepted: int, seconds: float | None = None):
        """Record one round: how many tokens were drafted and accepted, and (if timed) the round's seconds."""
        if num_drafted:
            self.acceptance.update(num_drafted, num_accepted)
            self.skipping = False
            if not self.probing:  # a drafting round: probes start again from the shortest gap
                self.probe_gap = self.probe_every
        if seconds is not None:
            self.costs.record(num_drafted, seconds)


# A drop-in round where drafting does not pay proposes prompt lookup's draft instead: at most this many tokens (as
# transformers' prompt lookup and the tree loop's lookup branch in the shipped method).
LOOKUP_TOKENS = 10
# ... after the longest n-gram ending the context, n <= this, that occurred earlier.
LOOKUP_NGRAM = 3


def prompt_lookup_match(ids: torch.Tensor, max_ngram: int = LOOKUP_NGRAM) -> tuple[int, int]:
    """The size n of the longest n-gram (n <= max_ngram) ending the context `ids` [L] that occurred earlier, and where
    the tokens that followed its latest earlier occurrence start: (0, L) where none did. Prompt lookup's draft is
    what follows from there. (`hf_specdiff.decoding.prompt_lookup`, in a file that ships standalone, returns several
    such drafts.)"""
    for n in range(min(max_ngram, ids.shape[0] - 1), 0, -1):
        hits = (ids[:-1].unfold(0, n, 1) == ids[-n:]).all(-1).nonzero().flatten()
        if len(hits):
            return n, int(hits[-1]) + n
    return 0, ids.shape[0]


class AssistantRounds:
    """What a drafter called by transformers' assisted loop learns between calls, for its `DraftLengthPolicy`.

    The loop tells a drafter nothing back, but each call's `input_ids` start with the previous call's input, then
    the accepted draft tokens: comparing them with the draft gives the accepted count. The time from one call's
    start to the next is a whole round (drafting, the verifier's forward, the loop's bookkeeping). The first round
    is not timed: its verifier forward also reads the prompt.

    With `lookup_policies` (one per n-gram size n = 1, 2, ..., sharing one `RoundCosts`), a round proposes prompt
    lookup's draft instead of the drafter's where the drafter's policy skips drafting (as long as the policy of the
    n-gram matched finds it worth verifying) and where that policy expects more tokens per second than the drafter's
    (`next_draft`). One policy per n: what followed a trigram is accepted far more often than what followed a single
    token (on SmolLM2's Spec-Bench outputs, the first token 78% against 22% of the time), and a policy that mixed
    them verified unigram drafts on the strength of trigram ones. Each policy learns from the rounds it drafted; the
    cost of a plain step (a round that drafted nothing) goes to the drafter's costs and the lookups'.
    """

    def __init__(self, policy: DraftLengthPolicy, lookup_policies: list[DraftLengthPolicy] | None = None):
        self.policy, self.lookup_policies = policy, lookup_policies or []
        self.source = policy  # the policy whose decision the last round followed
        self.draft: torch.Tensor | None = None  # [g] the last draft
        self.start = 0  # length of the input it was drafted after
        self.started_at = 0.0
        self.timed = False

    def observe(self, input_ids: torch.Tensor):
        """Call at the start of a drafting call with its `input_ids` [1, seq]."""
        now = device_clock(input_ids.device)
        if input_ids.shape[1] > self.start:
            self.policy.update_shadow(int(input_ids[0, self.start]))
        if self.draft is not None:
            # the loop appended the accepted draft tokens and one token of the verifier's, which differs from the
            # draft's next token (greedy: the argmax that rejected it; sampling: a draw from a residual without it)
            accepted = min(self.draft.shape[0], input_ids.shape[1] - self.start - 1)
            seconds = now - self.started_at if self.timed else None
            self.source.update(self.draft.shape[0], accepted, seconds)
            if self.lookup_policies and self.draft.shape[0] == 0:  # a plain step (only the drafter's policy skips)
                self.lookup_policies[0].update(0, 0, seconds)
            self.timed = True
        self.started_at = now

    def next_draft(self, input_ids: torch.Tensor, max_tokens: int, allow_skip: bool) -> tuple[int, list[int]]:
        """This round's draft: how many tokens the drafter drafts, or prompt lookup's draft (one of the two, or
        neither for a plain step). `allow_skip`: whether the caller's loop takes an empty draft; if not, a round
        with neither drafts one token (a probe)."""
        self.source = self.policy
        if not self.lookup_policies:
            return min(max_tokens, self.policy.next_length(allow_skip=allow_skip, allow_shadow=allow_skip)), []
        length = min(max_tokens, self.policy.next_length(allow_skip=True, allow_shadow=allow_skip))
        lookup_policy, lookup = self._lookup_draft(input_ids[0], max_tokens, length)
        if lookup:
            self.source = lookup_policy
            return 0, lookup
        return (length if length or allow_skip else 1), []

    def _lookup_draft(self, ids: torch.Tensor, max_tokens: int, length: int
                      ) -> tuple[DraftLengthPolicy | None, list[int]]:
        """Prompt lookup's draft after the context `ids` [L] and the policy of the n-gram it matched, if it is to
        replace the drafter's decision `length`: where the drafter skips, as long as that policy finds it worth
        verifying; where the drafter drafts (not a probe), that policy's best length if it is expected to give more
        tokens per second, or was never timed (once the drafter's rounds were). Neither for a plain step taken to
        measure one."""
        if not (length == 0 and self.policy.skipping or length and not self.policy.skipping and self.policy.timed):
            return None, []
        ngram, start = prompt_lookup_match(ids, len(self.lookup_policies))
        if not ngram:
            return None, []
        lookup_policy = self.lookup_policies[ngram - 1]
        if length == 0:
            num_tokens = lookup_policy.next_length(allow_skip=True)
        else:
            num_tokens, rate = lookup_policy.best()
            if lookup_policy.timed and rate <= float(self.policy.tokens_per_second(torch.tensor([length]))[0]):
                return None, []
        return lookup_policy, ids[start:start + min(max_tokens, num_tokens)].tolist()

    @property
    def shadow_probe(self) -> bool:
        """Whether this round drafts a shadow probe's token, verified by nobody (`DraftLengthPolicy`)."""
        return self.policy.shadow_probe

    def shadowed(self, token: int, seconds: float):
        """Call after drafting a shadow probe's `token` in `seconds`, which the round's time leaves out (it is not a
        cost of the plain step the round is)."""
        self.policy.shadowed([token])
        self.started_at += seconds

    def drafted(self, input_ids: torch.Tensor, draft: torch.Tensor):
        """Call after drafting `draft` [1, g] after `input_ids` [1, seq]."""
        self.draft, self.start = draft[0], input_ids.shape[1]
