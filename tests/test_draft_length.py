"""The adaptive draft length of the linear paths: measured acceptance against the measured cost of a round."""

import pytest
import torch

import hf_specdiff.costs_specdiff as costs_specdiff
from hf_specdiff.costs_specdiff import CostProfile, RoundCosts
from hf_specdiff.policies_specdiff import AssistantRounds, DraftLengthPolicy
from helpers import greedy_sequences, tiny_drafter, tiny_verifier, train_briefly

PROMPTS = torch.randint(3, 96, (12, 6), generator=torch.Generator().manual_seed(4))
# as if each drafted token cost two plain steps (seconds of a verifier forward by new tokens; the drafter free)
DEAR_TOKENS = CostProfile({1: 1.0, 2: 3.0, 3: 5.0})
# a verified token cheap but the drafter's call as dear as a plain step: drafting does not pay, and a verified probe
# loses less than a shadow probe (the drafter's call alone) would
DEAR_DRAFTER = CostProfile({1: 1.0, 2: 1.2, 3: 1.4}, {1: 1.0, 16: 1.0})


@pytest.fixture
def no_wall_clock(monkeypatch):
    """Rounds keep the costs a test gave (tiny models' wall-clock times on a loaded machine would decide otherwise)."""
    monkeypatch.setattr(RoundCosts, "record", lambda *args: None)


def paired(verifier, drafter, profile: CostProfile):
    """`drafter` attached to `verifier`, its drop-in rounds costed by `profile`."""
    drafter.attach(verifier)
    costs_specdiff.set_cost_profile(verifier, drafter, profile)
    return drafter


def generation(policy: DraftLengthPolicy, generator, rate: float, rounds: int, cost, allow_skip: bool = True):
    """Run `rounds` rounds where each drafted position is accepted with `rate` (given the ones before it) and a round
    of length g costs cost(g) seconds; return the length of every round."""
    lengths = []
    for _ in range(rounds):
        g = policy.next_length(allow_skip=allow_skip)
        accepted = int((torch.rand(g, generator=generator) < rate).long().cumprod(0).sum())
        policy.update(g, accepted, cost(g))
        lengths.append(g)
    return lengths


def measured(policy: DraftLengthPolicy, cost, accepted_rate: float, rounds: int = 200):
    """The length a policy that never skips settles on after `rounds` rounds (see `generation`)."""
    generation(policy, torch.Generator().manual_seed(0), accepted_rate, rounds, cost, allow_skip=False)
    return policy.next_length()


def test_round_costs_fit_a_line_and_never_call_a_token_free():
    costs = RoundCosts()
    for g, seconds in [(1, 0.05), (4, 0.08), (16, 0.20), (16, 0.22)]:
        costs.record(g, seconds)
    predicted = costs.predict(torch.tensor([1.0, 8.0, 16.0]))
    assert predicted[0] == pytest.approx(0.05, abs=0.01) and predicted[2] == pytest.approx(0.21, abs=0.01)
    flat = RoundCosts()
    flat.record(2, 0.1)
    flat.record(8, 0.09)  # noise: longer looked cheaper
    assert flat.predict(torch.tensor([16.0])) > flat.predict(torch.tensor([1.0]))


def test_a_round_that_drafts_pays_the_drafter_once_not_per_token():
    """Plain steps (g = 0) cost 1; any drafting round pays a drafter forward as dear as a step, then 0.03 a token:
    the line is fitted to the drafting rounds only, so the drafter's cost is not charged again for every token."""
    policy = DraftLengthPolicy(16)
    for length, seconds, times in ((0, 1.0, 20), (1, 2.0, 5), (8, 2.2, 5)):
        for _ in range(times):
            policy.costs.record(length, seconds)
    predicted = policy.costs.predict(torch.tensor([0, 1, 8, 16]))
    assert predicted.tolist() == pytest.approx([1.0, 2.0, 2.2, 2.2 + 8 * 0.2 / 7], abs=1e-4)
    for _ in range(50):  # two drafts in three accepted whole, the third rejected at its first token
        policy.acceptance.update(16, 16)
        policy.acceptance.update(16, 0)
        policy.acceptance.update(16, 16)
    assert policy.next_length(allow_skip=True) >= 8


@pytest.mark.parametrize("slope,rate,expected", [(0.02, 0.9, (10, 16)), (0.3, 0.9, (2, 6)), (0.3, 0.2, (1, 1)),
                                                 (0.02, 0.05, (1, 2))])
def test_policy_drafts_long_only_where_it_pays(slope, rate, expected):
    length = measured(DraftLengthPolicy(16), lambda g: 0.05 * (1 + slope * g), rate)
    assert expected[0] <= length <= expected[1]


def test_a_drafting_policy_measures_plain_steps_and_skips_once_they_show_drafting_does_not_pay():
    """A drafting round pays the drafter's forward once (here a quarter of a step): the line through the drafting
    rounds, extrapolated to g = 0, puts a plain step at 1.25 and drafting at 20% acceptance looks worth it. Measured,
    a plain step costs 1.0 and the policy skips; a drafter accepted at 80% goes on drafting, with a measuring plain
    step only every `plain_every` rounds once enough are measured."""
    def run(rate):
        return generation(DraftLengthPolicy(16), torch.Generator().manual_seed(0), rate, 300,
                          lambda g: 1.0 if g == 0 else 1.25 + 0.02 * g)

    rejected, accepted = run(0.2), run(0.8)
    assert rejected[-100:].count(0) >= 90, rejected
    plain_steps = accepted[-2 * DraftLengthPolicy.plain_every:].count(0)
    assert min(accepted[-100:]) == 0 and plain_steps <= 2 and min(g for g in accepted[-100:] if g) >= 3, accepted


def test_a_policy_from_a_profile_takes_plain_steps_from_round_one_where_drafting_cannot_pay():
    """With this machine's costs known, no round is spent learning them: where a verified token costs what a plain
    step does (an AVX2-only CPU in bf16, docs/tuning.md), the first rounds are plain steps, probes excepted; where
    it is nearly free (AVX512-BF16), the first round drafts."""
    avx2 = CostProfile({1: 0.0445, 2: 0.0538, 4: 0.0832, 8: 0.143, 16: 0.267}, {1: 0.0064, 16: 0.0122})
    avx512 = CostProfile({1: 0.040, 2: 0.041, 4: 0.044, 8: 0.047, 16: 0.055}, {1: 0.006, 16: 0.009})

    def first_rounds(profile, rate, rounds=8):
        policy = DraftLengthPolicy(16, costs=RoundCosts(prior=profile.round_seconds))
        return generation(policy, torch.Generator().manual_seed(0), rate, rounds, lambda g: None)

    assert first_rounds(avx2, 0.1) == [1] + [0] * 7  # one token tried, rejected: plain steps from then on
    assert first_rounds(DEAR_TOKENS, 0.9) == [0] * 7 + [1]  # even a perfect drafter cannot pay: a probe only
    assert min(first_rounds(avx512, 0.9)) >= 2  # drafting pays from the first round


def test_probes_grow_rarer_while_drafting_does_not_pay():
    policy = DraftLengthPolicy(16)
    for length, seconds in ((0, 1.0), (1, 3.0), (2, 5.0)):  # each drafted token costs two plain steps
        policy.costs.record(length, seconds)

    def probe_rounds(rounds):
        probes = []
        for i in range(1, rounds + 1):
            g = policy.next_length(allow_skip=True)
            if g:
                probes.append(i)
                policy.update(g, 0)
        return probes

    gaps = DraftLengthPolicy.probe_every * torch.tensor([1, 2, 4, 8, 8, 8]).clamp_max(
        DraftLengthPolicy.max_probe_every // DraftLengthPolicy.probe_every)
    assert probe_rounds(300) == gaps.cumsum(0)[gaps.cumsum(0) <= 300].tolist()
    for _ in range(50):  # drafting pays now (every probe accepted, verification cheap): no skipping, no probes
        policy.update(1, 1, 1.0)
        policy.update(4, 4, 1.1)
    assert policy.next_length(allow_skip=True) > 1 and policy.probe_gap == DraftLengthPolicy.probe_every


def test_a_skipping_policy_weighs_the_lengths_again_only_after_a_round_that_drafts():
    policy = DraftLengthPolicy(16)
    for length, seconds in ((0, 1.0), (1, 3.0), (2, 5.0)):  # each drafted token costs two plain steps
        policy.costs.record(length, seconds)
    weighed, predict = [], policy.costs.predict
    policy.costs.predict = lambda lengths: weighed.append(len(lengths)) or predict(lengths)
    every = DraftLengthPolicy.probe_every
    assert [policy.next_length(allow_skip=True) for _ in range(every)] == [0] * (every - 1) + [1]
    assert len(weighed) == 1
    for _ in range(10):  # the probe and the rounds after it: accepted, and verification cheap after all
        policy.update(1, 1, 1.0)
        policy.update(2, 2, 1.05)
    assert policy.next_length(allow_skip=True) > 1 and len(weighed) == 2


def drop_in(verifier, drafter, prompt, lengths, do_sample=False):
    """Plain assisted generation with `drafter`; `lengths` receives the length of every draft it made."""
    original = drafter.draft

    def draft(input_ids, cache, num_tokens, *args, **kwargs):
        lengths.append(num_tokens)
        return original(input_ids, cache, num_tokens, *args, **kwargs)

    drafter.draft = draft
    try:
        return verifier.generate(prompt, assistant_model=drafter, max_new_tokens=60, do_sample=do_sample,
                                 eos_token_id=None)
    finally:
        del drafter.draft


def test_drop_in_path_shortens_drafts_that_are_rejected_and_stays_exact(no_wall_clock):
    """(The drafter's own lengths: without the prompt-lookup drafts that would replace some of its rounds.)"""
    verifier = tiny_verifier("llama")
    trained = train_briefly(tiny_drafter(verifier, block_size=16), greedy_sequences(verifier, PROMPTS, 48), steps=120)
    untrained = tiny_drafter(verifier, block_size=16)  # its drafts are almost never accepted
    # a plain step costs 1, a drafting round 1.2 + 0.01 a token
    profile = CostProfile({1: 1.0, 17: 1.16}, {1: 0.2, 16: 0.2})
    drafts = {}
    for drafter in (untrained, trained):
        drafter.assistant_lookup_tokens = 0
        paired(verifier, drafter, profile)
        drafts[drafter] = []
        for prompt in PROMPTS[:3].split(1):
            out = drop_in(verifier, drafter, prompt, drafts[drafter])
            plain = verifier.generate(prompt, max_new_tokens=60, do_sample=False, eos_token_id=None)
            assert out.tolist() == plain.tolist()
    later = sorted(drafts[untrained][len(drafts[untrained]) // 2:])
    assert later[len(later) // 2] <= 1, drafts[untrained]  # one-token probes
    lengths = drafts[trained]  # most drafted tokens in long drafts (the last rounds are cut by max_new_tokens)
    assert sum(g for g in lengths if g >= 8) >= sum(lengths) / 2, lengths
    untrained.generation_config.num_assistant_tokens_schedule = "constant"  # the user's opt-out: what is asked
    lengths = []
    drop_in(verifier, untrained, PROMPTS[:1], lengths)
    assert set(lengths[:40]) == {16}  # the last rounds are cut by max_new_tokens


def test_tree_budget_weighs_acceptance_against_measured_cost():
    from math import log

    from hf_specdiff.decoding import tree_budget

    from hf_specdiff.decoding import prune_drafts

    probs = [0.9, 0.5, 0.3, 0.2]  # the candidate nodes' acceptance probabilities, best first

    def costs(*points):
        fitted = RoundCosts()
        for nodes, seconds in points:
            fitted.record(nodes, seconds)
        return fitted

    assert tree_budget(probs, costs((1, 1.0), (15, 1.05)), 15) == 4  # nodes nearly free: take them all
    assert tree_budget(probs, costs((1, 1.0), (15, 1.05)), 3) == 3  # never more than the cap
    assert tree_budget(probs, costs((1, 1.2), (4, 1.9)), 15) == 2  # each node costs a fifth of a step
    assert tree_budget(probs, costs((1, 3.0), (2, 5.0)), 15) == 0  # dearer than they are worth: plain steps
    rows, scores = [[1, 2, 3], [1, 4]], [[log(0.9), log(0.5), log(0.2)], [log(0.9), log(0.3)]]  # the same 4 nodes
    assert prune_drafts(rows, scores, 15, costs=costs((1, 1.2), (4, 1.9))) == [[1, 2], [1]]


def test_tree_rounds_too_dear_to_draft_are_plain_steps_and_exact(no_wall_clock):
    import hf_specdiff

    verifier = tiny_verifier("llama")
    drafter = tiny_drafter(verifier, block_size=8)
    forwards = []
    draft = drafter.draft
    drafter.draft = lambda *args, **kwargs: forwards.append(1) or draft(*args, **kwargs)
    stats = hf_specdiff.SpecDiffStats()
    out = hf_specdiff.generate(verifier, drafter, PROMPTS[:1], max_new_tokens=20, do_sample=False, eos_token_id=None,
                               num_drafts=4, lookup_tokens=4, stats=stats, cost_profile=DEAR_TOKENS)
    assert out.tolist() == verifier.generate(PROMPTS[:1], max_new_tokens=20, do_sample=False,
                                             eos_token_id=None).tolist()
    assert stats.rounds == 20 and sum(stats.drafted[:1]) <= 2, stats.as_dict()  # one token per round, 0 nodes
    assert len(forwards) <= 20 // DraftLengthPolicy.probe_every  # the drafter runs for probes only


def test_k1_loop_skips_drafting_where_it_does_not_pay_and_probes_now_and_then(no_wall_clock):
    import hf_specdiff

    verifier = tiny_verifier("llama")
    drafter = tiny_drafter(verifier, block_size=8)
    stats = hf_specdiff.SpecDiffStats()
    out = hf_specdiff.generate(verifier, drafter, PROMPTS[:1], max_new_tokens=40, do_sample=False, eos_token_id=None,
                               stats=stats, cost_profile=DEAR_DRAFTER)
    assert out.tolist() == verifier.generate(PROMPTS[:1], max_new_tokens=40, do_sample=False,
                                             eos_token_id=None).tolist()
    drafting_rounds = stats.drafted[0] if stats.drafted else 0
    assert 1 <= drafting_rounds <= 40 // DraftLengthPolicy.probe_every + 1, stats.as_dict()
    assert stats.shadow_probes == 0  # the drafter's call is dear: verified probes lose less


def test_a_shadow_probe_counts_as_accepted_where_the_next_committed_token_was_drafted():
    policy = DraftLengthPolicy(8)
    policy.update_shadow(3)  # no probe pending: nothing recorded
    assert policy.acceptance.reached[0] == 0
    policy.shadowed([5, 7])  # a tree loop's two likeliest first tokens
    policy.update_shadow(7)
    policy.update_shadow(7)  # resolved once
    assert (policy.acceptance.reached[0], policy.acceptance.accepted[0]) == (1, 1)
    policy.shadowed([5, 7])
    policy.update_shadow(9)
    assert (policy.acceptance.reached[0], policy.acceptance.accepted[0]) == (2, 1)
    assert list(map(float, policy.acceptance.reached[1:])) == [0.0] * 7  # one token: the first position alone


def test_the_assistant_rounds_compare_a_shadow_probe_with_the_token_the_loop_appended_next():
    policy = DraftLengthPolicy(8)
    rounds = AssistantRounds(policy)
    ids = torch.tensor([[1, 2, 3]])
    rounds.observe(ids)
    rounds.shadowed(4, 0.0)
    rounds.drafted(ids, ids[:, :0])  # a plain step
    rounds.observe(torch.tensor([[1, 2, 3, 4]]))
    assert (policy.acceptance.reached[0], policy.acceptance.accepted[0]) == (1, 1)
    rounds.shadowed(8, 0.0)
    rounds.drafted(torch.tensor([[1, 2, 3, 4]]), ids[:, :0])
    rounds.observe(torch.tensor([[1, 2, 3, 4, 5]]))
    assert (policy.acceptance.reached[0], policy.acceptance.accepted[0]) == (2, 1)


def test_a_probe_verifies_nothing_where_the_drafters_call_costs_less_than_a_verified_token_loses():
    """A verified one-token probe costs a round of length 1 and brings 1 + a_0 tokens; a shadow probe costs the
    drafter's call alone. The policy takes the cheaper one, only where the loop allows shadows (greedy), and a
    shadow probe's outcome (`update_shadow`) makes the next round weigh the lengths again."""
    def policy(verifier_seconds, drafter_seconds):  # drafting at the prior's acceptance does not pay on either
        profile = CostProfile(verifier_seconds, {1: drafter_seconds, 16: drafter_seconds})
        return DraftLengthPolicy(8, costs=RoundCosts(prior=profile.round_seconds), draft_seconds=profile.drafter_seconds)

    every = DraftLengthPolicy.probe_every
    cheap = policy({1: 1.0, 2: 1.8, 16: 3.0}, 0.05)  # a verified probe loses 0.35 plain steps, a shadow one 0.05
    assert [cheap.next_length(allow_skip=True, allow_shadow=True) for _ in range(every)] == [0] * every
    assert cheap.shadow_probe and not cheap.probing
    assert cheap.next_length(allow_skip=True, allow_shadow=True) == 0 and not cheap.shadow_probe
    for _ in range(20):
        cheap.shadowed([4])
        cheap.update_shadow(4)  # every probe's token would have been accepted: long drafts pay
    assert cheap.next_length(allow_skip=True, allow_shadow=True) > 1
    dear = policy({1: 1.0, 2: 1.2, 16: 4.0}, 1.0)  # a verified probe loses 0.7 plain steps, a shadow one 1.0
    assert [dear.next_length(allow_skip=True, allow_shadow=True) for _ in range(every)] == [0] * (every - 1) + [1]
    assert dear.probing and not dear.shadow_probe
    sampling = policy({1: 1.0, 2: 1.8, 16: 3.0}, 0.05)  # a loop that takes no shadow probe
    assert [sampling.next_length(allow_skip=True) for _ in range(every)] == [0] * (every - 1) + [1]


@pytest.mark.parametrize("num_drafts,lookup_tokens", [(1, 0), (4, 4)])
def test_greedy_loops_measure_acceptance_with_shadow_probes_where_verifying_a_token_is_dear(num_drafts, lookup_tokens,
                                                                                           no_wall_clock, monkeypatch):
    """Where a verified token costs two plain steps and the drafter's call nothing, the tree loop's probes verify no
    drafted token: their drafts are compared with the tokens committed next, and the policy learns from that. The
    output stays plain greedy's; sampling keeps verified probes."""
    import hf_specdiff

    verifier = tiny_verifier("llama")
    drafter = tiny_drafter(verifier, block_size=8)
    shadows = record_shadows(monkeypatch)
    stats = hf_specdiff.SpecDiffStats()
    out = hf_specdiff.generate(verifier, drafter, PROMPTS[:1], max_new_tokens=40, do_sample=False, eos_token_id=None,
                               num_drafts=num_drafts, lookup_tokens=lookup_tokens, stats=stats, cost_profile=DEAR_TOKENS)
    expected = verifier.generate(PROMPTS[:1], max_new_tokens=40, do_sample=False, eos_token_id=None)
    assert out.tolist() == expected.tolist()
    assert 1 <= stats.shadow_probes <= 40 // DraftLengthPolicy.probe_every and not any(stats.drafted), stats.as_dict()
    assert len(shadows) == stats.shadow_probes, shadows  # each compared with the token committed next, once
    assert all(len(drafted) == num_drafts and next_token in expected[0, PROMPTS.shape[1]:].tolist()
               for drafted, next_token in shadows), shadows
    sampled = hf_specdiff.SpecDiffStats()
    hf_specdiff.generate(verifier, drafter, PROMPTS[:1], max_new_tokens=40, do_sample=True, eos_token_id=None,
                         num_drafts=num_drafts, lookup_tokens=lookup_tokens, stats=sampled, cost_profile=DEAR_TOKENS)
    assert sampled.shadow_probes == 0


def test_drop_in_probes_verify_nothing_where_verifying_a_token_is_dear(no_wall_clock, monkeypatch):
    """transformers' greedy loop runs plain steps only, the drafter's shadow probes measuring its acceptance."""
    verifier = tiny_verifier("llama")
    drafter = paired(verifier, tiny_drafter(verifier, block_size=8), DEAR_TOKENS)
    drafter.assistant_lookup_tokens = 0
    shadows = record_shadows(monkeypatch)
    forwards = []
    hook = verifier.register_forward_hook(lambda _, args, kwargs, out: forwards.append(kwargs["input_ids"].shape[1]),
                                          with_kwargs=True)
    try:
        out = drop_in(verifier, drafter, PROMPTS[:1], [])
    finally:
        hook.remove()
    assert out.tolist() == verifier.generate(PROMPTS[:1], max_new_tokens=60, do_sample=False,
                                             eos_token_id=None).tolist()
    assert set(forwards[1:]) == {1}, forwards  # after the prompt, plain steps only
    assert shadows and all(len(drafted) == 1 for drafted, _ in shadows), shadows


def record_shadows(monkeypatch) -> list[tuple[list[int], int]]:
    """(the tokens drafted, the token committed next) of every shadow probe the loops resolve from here on."""
    shadows = []
    update_shadow = DraftLengthPolicy.update_shadow

    def recording(self, next_token):
        if self.shadow_tokens is not None:
            shadows.append((list(self.shadow_tokens), next_token))
        update_shadow(self, next_token)
    monkeypatch.setattr(DraftLengthPolicy, "update_shadow", recording)
    return shadows


def test_a_draft_the_tree_budget_cuts_whole_counts_as_a_skip_and_the_probes_keep_their_gap():
    policy = DraftLengthPolicy(8, costs=RoundCosts(prior=CostProfile({1: 1.0, 2: 1.01, 16: 1.1}).round_seconds))
    assert policy.next_length(allow_skip=True) > 0  # untried, verification nearly free: it drafts
    policy.decline()
    every = DraftLengthPolicy.probe_every
    assert [policy.next_length(allow_skip=True) for _ in range(every)] == [0] * (every - 1) + [1]
    policy.update(1, 1)  # the probe, verified
    assert policy.next_length(allow_skip=True) > 0
    policy.decline()  # cut again: the gap the probe doubled stands
    assert [policy.next_length(allow_skip=True) for _ in range(2 * every)] == [0] * (2 * every - 1) + [1]
    policy.update(1, 1)
    policy.next_length(allow_skip=True)
    policy.update(3, 3)  # a drafting round verified: probes start again from the shortest gap
    assert policy.probe_gap == every


def test_k1_loop_calls_the_drafter_for_probes_only_while_the_tree_budget_cuts_its_drafts(no_wall_clock, monkeypatch):
    import hf_specdiff
    import hf_specdiff.decoding as decoding

    verifier = tiny_verifier("llama")
    drafter = tiny_drafter(verifier, block_size=8)
    calls, draft = [], drafter.draft
    drafter.draft = lambda *args, **kwargs: calls.append(1) or draft(*args, **kwargs)
    monkeypatch.setattr(decoding, "tree_budget", lambda *args: 0)  # no node is worth verifying
    cheap = CostProfile({1: 1.0, 2: 1.01, 16: 1.1})  # while the length policy thinks drafting pays
    out = hf_specdiff.generate(verifier, drafter, PROMPTS[:1], max_new_tokens=40, do_sample=False, eos_token_id=None,
                               cost_profile=cheap)
    assert out.tolist() == verifier.generate(PROMPTS[:1], max_new_tokens=40, do_sample=False,
                                             eos_token_id=None).tolist()
    assert len(calls) <= 40 // DraftLengthPolicy.probe_every + 1  # not a wasted drafter call every round


def test_round_costs_learn_what_drafting_rounds_and_plain_steps_add_apart():
    costs = RoundCosts(prior=CostProfile({1: 1.0, 2: 1.5, 8: 2.0}).round_seconds)
    for _ in range(12):
        costs.record(0, 1.0)  # plain steps cost what the profile says
    for _ in range(4):
        costs.record(3, float(costs.prior(torch.tensor([3]))[0]) + 0.8)  # drafting rounds 0.8 s more
    predicted, prior = costs.predict(torch.tensor([0, 3])), float(costs.prior(torch.tensor([3]))[0])
    assert predicted[0] == pytest.approx(1.0, rel=0.05)
    assert prior + 0.4 < predicted[1] < prior + 0.8  # at least what 4 rounds against 4 at the prior's say


@pytest.mark.parametrize("slowdown", [1.5, 0.67])
def test_round_costs_scale_every_length_by_how_much_slower_the_machine_runs(slowdown):
    """A machine slower (or faster) than when its profile was measured slows every forward alike: a round of 15
    nodes, never run, is priced at the slowdown times the profile's, not the profile's plus what short rounds added
    (that priced it 18% under its cost at 1.5x slower)."""
    costs = RoundCosts(prior=CostProfile({1: 1.0, 2: 1.5, 8: 2.0}).round_seconds)
    assert costs.slowdown == 1.0
    for length in [0, 3] * 12:
        costs.record(length, slowdown * float(costs.prior(torch.tensor([length]))[0]))
    assert (costs.slowdown - 1) / (slowdown - 1) > 0.8  # most of the way from the prior's 1 after 24 rounds
    predicted = costs.predict(torch.tensor([0, 3, 15]))
    truth = slowdown * costs.prior(torch.tensor([0, 3, 15])).float()
    assert torch.allclose(predicted, truth, rtol=0.04), (predicted, truth)


@pytest.mark.parametrize("conditioned", [False, True])
def test_drop_in_path_skips_drafting_where_it_does_not_pay_greedy_only(conditioned, no_wall_clock):
    """transformers' greedy loop takes an empty draft (a plain step), so the drop-in drafter drafts only every
    probe_every-th round when drafting costs more than it brings; sampling needs a draft in every round. A
    conditioned drafter reads the skipped rounds' verifier features when it drafts next. (Without the prompt-lookup
    drafts that skipped rounds propose otherwise: tested below.)"""
    verifier = tiny_verifier("llama")
    drafter = tiny_drafter(verifier, block_size=8, conditioned=conditioned)
    drafter.assistant_lookup_tokens = 0
    paired(verifier, drafter, DEAR_TOKENS)
    lengths = []
    out = drop_in(verifier, drafter, PROMPTS[:1], lengths)
    assert out.tolist() == verifier.generate(PROMPTS[:1], max_new_tokens=60, do_sample=False,
                                             eos_token_id=None).tolist()
    assert 1 <= len(lengths) <= 60 // DraftLengthPolicy.probe_every + 1, lengths
    lengths, forwards = [], []
    hook = verifier.register_forward_hook(lambda _, args, kwargs, out: forwards.append(kwargs["input_ids"].shape[1]),
                                          with_kwargs=True)
    try:
        torch.manual_seed(0)
        sampled = drop_in(verifier, drafter, PROMPTS[:1], lengths, do_sample=True)
    finally:
        hook.remove()
    assert sampled.shape[1] == PROMPTS.shape[1] + 60 and min(lengths) >= 1
    # a draft every round, except a last one with room for the final token alone (a plain step, reading one token)
    plain_steps = int(forwards[-1] == 1)
    assert len(forwards) == len(lengths) + plain_steps and 1 not in forwards[:-1], (forwards, lengths)


def test_drop_in_rounds_that_skip_drafting_propose_prompt_lookup_drafts_and_stay_exact(no_wall_clock, monkeypatch):
    """Where drafting does not pay, a round proposes what followed the context's last tokens earlier: on a prompt
    that repeats itself, the verifier takes several tokens a forward without the drafter drafting, greedy output
    stays plain greedy's, and the lookup rounds' acceptance goes to the lookup policy, not the drafter's."""
    verifier = tiny_verifier("llama")
    drafter = paired(verifier, tiny_drafter(verifier, block_size=8), CostProfile({1: 1.0, 2: 1.2, 3: 5.0}))
    rounds = []  # the generation's round tracker, which holds its policies
    init = AssistantRounds.__init__
    monkeypatch.setattr(AssistantRounds, "__init__", lambda self, *args: rounds.append(self) or init(self, *args))
    prompt = verifier.generate(PROMPTS[:1], max_new_tokens=30, do_sample=False, eos_token_id=None)  # greedy loops
    lengths, forwards = [], []
    hook = verifier.register_forward_hook(lambda *_: forwards.append(1))
    try:
        out = drop_in(verifier, drafter, prompt, lengths)
    finally:
        hook.remove()
    assert out.tolist() == verifier.generate(prompt, max_new_tokens=60, do_sample=False, eos_token_id=None).tolist()
    assert len(forwards) < 60 / 1.5 and len(lengths) <= 60 // DraftLengthPolicy.probe_every + 1, (forwards, lengths)
    assert sum(float(policy.acceptance.accepted[0]) for policy in rounds[0].lookup_policies) > 0
    assert float(rounds[0].policy.acceptance.reached[0]) <= len(lengths)


def test_drop_in_rounds_propose_prompt_lookup_where_it_is_expected_to_pay_more_than_the_drafter():
    """A round where the drafter would draft proposes prompt lookup's draft instead when the policy of the n-gram it
    matched expects more tokens per second (or was never timed), and the drafter's draft when it expects fewer."""
    ids = torch.tensor([[5, 6, 7, 8, 9, 5, 6]])  # lookup after the bigram "5 6": [7, 8, 9, 5, 6]
    drafter_policy = DraftLengthPolicy(8)
    unigram, bigram, trigram = (DraftLengthPolicy(10, costs=costs) for costs in [RoundCosts()] * 3)
    for g, seconds in ((0, 1.0), (2, 1.5), (4, 1.7)):
        drafter_policy.update(g, g // 2, seconds)  # half its drafts accepted, some tokens a round
    rounds = AssistantRounds(drafter_policy, [unigram, bigram, trigram])
    length, lookup = rounds.next_draft(ids, 8, allow_skip=True)  # lookup never timed: tried
    assert length == 0 and lookup and lookup == [7, 8, 9, 5, 6][:len(lookup)] and rounds.source is bigram
    for _ in range(20):  # bigram drafts rejected at once, at a plain step's cost
        bigram.update(4, 0, 1.1)
    length, lookup = rounds.next_draft(ids, 8, allow_skip=True)
    assert length > 0 and lookup == [] and rounds.source is drafter_policy
    for _ in range(40):  # unigram drafts accepted whole: not the bigram's
        unigram.update(5, 5, 1.1)
    assert rounds.next_draft(ids, 8, allow_skip=True)[0] > 0
    for _ in range(40):  # bigram drafts accepted whole
        bigram.update(5, 5, 1.1)
    assert rounds.next_draft(ids, 8, allow_skip=True) == (0, [7, 8, 9, 5, 6])
    assert rounds.next_draft(torch.tensor([[5, 6, 7, 8]]), 8, allow_skip=True)[0] > 0  # no lookup draft here
    assert rounds.next_draft(torch.tensor([[5, 6, 7, 5]]), 8, allow_skip=True) == (0, [6, 7, 5])  # unigram "5"
