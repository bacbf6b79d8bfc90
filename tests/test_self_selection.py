"""SpecDiff-2 self-selection: K drafts verified as one prefix tree, exact for greedy and sampling."""

import copy
import math
import os

import pytest
import torch
from transformers import StopStringCriteria

import hf_specdiff
import hf_specdiff.decoding as decoding
from hf_specdiff.costs_specdiff import CostProfile, RoundCosts
from hf_specdiff.policies_specdiff import AcceptanceRates, DraftLengthPolicy
from helpers import (ARCHS, PROMPTS, CollectingStreamer, sampled_sequences, sharp_verifier, tiny_drafter, tiny_tokenizer,
                     tiny_verifier, train_briefly, trained_standalone)
from stats import SAMPLES, chi_square_pvalue, exact_first_two

VERIFIERS = (*ARCHS, "gemma3")


@pytest.fixture(scope="module")
def trained():
    return trained_standalone


# Each architecture with each K and each draft length, and every (K, draft length) pair, without the full product.
GREEDY_CASES = [(arch, k, (1, 4, 16)[(i + j) % 3]) for i, arch in enumerate(VERIFIERS) for j, k in enumerate((1, 2, 8))]


@pytest.mark.parametrize("arch", VERIFIERS)
def test_one_draft_a_round_is_verified_under_the_models_own_causal_mask(trained, arch, monkeypatch):
    """K = 1 without a lookup branch verifies a chain: no tree mask, so an attention implementation that takes no 4D
    mask serves too (the check that guards the tree is not run)."""
    verifier, drafter = trained(arch)
    monkeypatch.setattr(decoding, "tree_attention_mask", lambda *a: pytest.fail("a tree mask for a chain"))
    monkeypatch.setattr(decoding, "_check_tree_support", lambda *a: pytest.fail("tree support checked for K = 1"))
    stats = hf_specdiff.SpecDiffStats()
    for prompt in PROMPTS[:2].split(1):
        plain = verifier.generate(prompt, max_new_tokens=40, do_sample=False, eos_token_id=None)
        out = hf_specdiff.generate(verifier, drafter, prompt, max_new_tokens=40, do_sample=False, eos_token_id=None,
                                   draft_length=4, stats=stats)
        assert out.tolist() == plain.tolist()
    assert stats.tau > 1.2, stats.as_dict()  # drafts were verified and accepted


@pytest.mark.parametrize("arch,num_drafts,draft_length", GREEDY_CASES)
def test_greedy_equals_plain(trained, arch, num_drafts, draft_length):
    verifier, drafter = trained(arch)
    for i, prompt in enumerate(PROMPTS[:2].split(1)):
        plain = verifier.generate(prompt, max_new_tokens=40, do_sample=False, eos_token_id=None)
        out = hf_specdiff.generate(verifier, drafter, prompt, max_new_tokens=40, do_sample=False, eos_token_id=None,
                                   num_drafts=num_drafts, draft_length=draft_length)
        assert out.tolist() == plain.tolist()
        eos = int(plain[0, prompt.shape[1] + 12 + i])
        plain = verifier.generate(prompt, max_new_tokens=40, do_sample=False, eos_token_id=eos)
        out = hf_specdiff.generate(verifier, drafter, prompt, max_new_tokens=40, do_sample=False, eos_token_id=eos,
                                   num_drafts=num_drafts, draft_length=draft_length)
        assert plain[0, -1] == eos and out.tolist() == plain.tolist()


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_eager_attention_greedy_equals_plain_on_every_path(trained, arch):
    """Eager attention (docs/tuning.md: faster than SDPA after long contexts on some CPUs) through K=1, the tree loop
    with a lookup branch and the drop-in path, token for token with plain greedy."""
    verifier, drafter = trained(arch)
    verifier = copy.deepcopy(verifier)
    verifier.set_attn_implementation("eager")
    assert verifier.config._attn_implementation == "eager"
    for prompt in PROMPTS[:2].split(1):
        kwargs = dict(max_new_tokens=40, do_sample=False, eos_token_id=None)
        plain = verifier.generate(prompt, **kwargs).tolist()
        assert hf_specdiff.generate(verifier, drafter, prompt, num_drafts=1, **kwargs).tolist() == plain
        assert hf_specdiff.generate(verifier, drafter, prompt, num_drafts=4, lookup_tokens=4, **kwargs).tolist() == plain
        assert verifier.generate(prompt, assistant_model=drafter, **kwargs).tolist() == plain


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("num_drafts", [1, 8])
def test_stop_strings_and_custom_generate_callable(trained, arch, num_drafts):
    verifier, drafter = trained(arch)
    tokenizer = tiny_tokenizer()
    prompt = PROMPTS[:1]
    plain = verifier.generate(prompt, max_new_tokens=40, do_sample=False, eos_token_id=None)
    stop = tokenizer.decode(plain[0, prompt.shape[1] + 14: prompt.shape[1] + 16])
    kwargs = dict(max_new_tokens=40, do_sample=False, eos_token_id=None, stop_strings=[stop], tokenizer=tokenizer)
    plain = verifier.generate(prompt, **kwargs)
    assert plain.shape[1] < prompt.shape[1] + 40
    out = hf_specdiff.generate(verifier, drafter, prompt, num_drafts=num_drafts, **kwargs)
    assert out.tolist() == plain.tolist()
    del kwargs["stop_strings"], kwargs["tokenizer"]  # transformers drops the tokenizer on the callable route
    out = verifier.generate(prompt, custom_generate=hf_specdiff.specdiff_generate, drafter=drafter,
                            num_drafts=num_drafts, stopping_criteria=[StopStringCriteria(tokenizer, [stop])], **kwargs)
    assert out.tolist() == plain.tolist()


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_compacted_cache_equals_fresh_cache(trained, arch):
    verifier, drafter = trained(arch)  # gemma3: sliding window 8, shorter than the context
    stats = hf_specdiff.SpecDiffStats()
    out = hf_specdiff.generate(verifier, drafter, PROMPTS[:1], max_new_tokens=40, do_sample=False, eos_token_id=None,
                               num_drafts=8, draft_length=8, return_dict_in_generate=True, stats=stats)
    assert stats.rounds < 40  # drafts were accepted, so the cache was compacted past rejected nodes
    sequence, cache = out.sequences, copy.deepcopy(out.past_key_values)
    assert cache.get_seq_length() == sequence.shape[1] - 1
    with torch.no_grad():
        cached = verifier(sequence[:, -1:], past_key_values=cache).logits[0, -1]
        fresh = verifier(sequence).logits[0, -1]
    torch.testing.assert_close(cached, fresh, rtol=1e-5, atol=1e-5)


def test_self_selection_raises_tau_and_reports_it(trained):
    verifier, drafter = trained("llama")
    taus = {}
    for num_drafts in (1, 8):
        stats = hf_specdiff.SpecDiffStats()
        budget = {"max_tree_nodes": 64} if num_drafts > 1 else {}  # the whole tree, not one sized by round times
        for prompt in PROMPTS[:6].split(1):
            hf_specdiff.generate(verifier, drafter, prompt, max_new_tokens=40, do_sample=False, eos_token_id=None,
                                 num_drafts=num_drafts, draft_length=8, stats=stats, **budget)
        assert stats.new_tokens == 6 * 40
        assert len(stats.acceptance_by_position) == 8
        taus[num_drafts] = stats.tau
    assert taus[8] > taus[1] > 1.0, taus


def test_prompt_lookup_drafts_what_followed_the_latest_longest_matches():
    ids = torch.tensor([5, 6, 7, 1, 9, 6, 7, 2, 5, 6, 7])
    assert decoding.prompt_lookup(ids, 3) == [[1, 9, 6]]  # the 3-gram "5 6 7" wins over the later 2-gram "6 7"
    assert decoding.prompt_lookup(ids, 3, num_drafts=4) == [[1, 9, 6]]  # it occurs once before
    assert decoding.prompt_lookup(ids, 3, max_ngram=2) == [[2, 5, 6]]  # "6 7": its latest earlier occurrence
    assert decoding.prompt_lookup(ids, 3, num_drafts=2, max_ngram=2) == [[2, 5, 6], [1, 9, 6]]  # latest first
    assert decoding.prompt_lookup(ids, 2, max_ngram=1) == [[2, 5]]
    assert decoding.prompt_lookup(torch.tensor([1, 2, 3]), 4) == []
    assert decoding.prompt_lookup(torch.tensor([4]), 4) == []
    repeats = torch.tensor([3, 4, 8, 3, 4, 8, 3, 5, 3])  # "3" is followed by "4" twice, then by "5"
    assert decoding.prompt_lookup(repeats, 1, num_drafts=3) == [[5], [4]]  # distinct drafts only


def test_fixed_drafts_join_the_tree():
    tree = decoding.DraftTree.from_drafts(torch.tensor([[1, 2], [1, 3]]), fixed=[[1, 2, 4], [6]])
    assert tree.tokens.tolist() == [1, 2, 3, 4, 6] and tree.parents == [-1, 0, 0, 1, -1]
    assert tree.draws[1] == [(4, 3, True)] and tree.fixed_only == {3, 4}
    assert [fixed for _, _, fixed in tree.draws[-1]] == [False, False, True, True]  # one draw per draft, in order


def test_prune_drafts_keeps_the_most_likely_prefixes():
    log_q = torch.tensor([[0.6, 0.3, 0.1], [0.5, 0.4, 0.1], [0.9, 0.05, 0.05]]).log()
    drafts = [[0, 0, 0], [0, 1, 0], [1, 0, 0]]
    scores = [log_q[torch.arange(3), torch.tensor(row)].cumsum(0).tolist() for row in drafts]
    # prefix probabilities: 0 .6 | 1 .3, 00 .3 | 000 .27 | 01 .24 | 010 .216 | 10 .15 (ties: the shorter first)
    assert decoding.prune_drafts(drafts, scores, 3) == [[0, 0], [0], [1]]
    assert decoding.prune_drafts(drafts, scores, 5) == [[0, 0, 0], [0, 1], [1]]
    assert decoding.prune_drafts(drafts, scores, 100) == drafts
    # a lookup row [2, 2] accepted at rates .5 then .9 competes for the same budget: 22 (.45) beats 000 (.27)
    lookup_scores = torch.tensor([0.5, 0.9]).log().cumsum(0).tolist()
    assert decoding.prune_drafts(drafts + [[2, 2]], scores + [lookup_scores], 5) == [[0, 0], [0], [1], [2, 2]]
    # a row sharing a prefix with another counts the shared nodes once
    assert decoding.prune_drafts([[0, 0], [0, 0, 1]], [[-0.1, -0.2], [-0.1, -0.2, -0.3]], 3) == [[0, 0], [0, 0, 1]]


def test_sibling_nodes_are_priced_as_the_exclusive_events_they_are():
    """Two lookup drafts measured at 0.9 and 0.8 propose different first tokens: at most one is accepted, so together
    they bring at most 1 token, not 1.7, and where a node costs half a plain step only the likelier pays."""
    costs = RoundCosts()
    for nodes, seconds in ((0, 1.0), (1, 1.5), (2, 2.0)):
        costs.record(nodes, seconds)
    rows, scores = [[5, 6], [7]], [[math.log(0.9), math.log(0.9 * 0.5)], [math.log(0.8)]]
    assert decoding.prune_drafts(rows, scores, 15, costs=costs) == [[5], []]
    ranked = dict(decoding._ranked_prefixes(rows, scores))
    assert ranked[(5,)] == pytest.approx(0.9 / 1.7) and ranked[(7,)] == pytest.approx(0.8 / 1.7)
    assert ranked[(5, 6)] == pytest.approx(0.5 * 0.9 / 1.7)  # its rate after 5 as measured


def test_tree_holds_at_most_max_tree_nodes_lookup_included(trained):
    verifier, drafter = trained("llama")
    prompt = PROMPTS[:1].repeat(1, 3)  # repeats itself: the lookup branch has a match from the start
    query_lengths = []
    hook = verifier.register_forward_pre_hook(
        lambda _, args, kwargs: query_lengths.append(kwargs["input_ids"].shape[1]), with_kwargs=True)
    try:
        out = hf_specdiff.generate(verifier, drafter, prompt, max_new_tokens=40, do_sample=False, eos_token_id=None,
                                   num_drafts=4, lookup_tokens=10, max_tree_nodes=5)
    finally:
        hook.remove()
    assert out.tolist() == verifier.generate(prompt, max_new_tokens=40, do_sample=False, eos_token_id=None).tolist()
    assert max(query_lengths[1:]) <= 1 + 5 and query_lengths[0] <= prompt.shape[1] + 5  # the committed token + nodes
    assert max(query_lengths[1:]) == 6  # the budget is used


def test_sampling_tree_holds_at_most_max_tree_nodes(trained):
    verifier, drafter = trained("llama")
    prompt = PROMPTS[:1].repeat(1, 3)  # four lookup drafts of 10 tokens and four drafter draws: far over 5 nodes
    query_lengths = []
    hook = verifier.register_forward_pre_hook(
        lambda _, args, kwargs: query_lengths.append(kwargs["input_ids"].shape[1]), with_kwargs=True)
    try:
        torch.manual_seed(0)
        hf_specdiff.generate(verifier, drafter, prompt, max_new_tokens=40, do_sample=True, eos_token_id=None,
                             num_drafts=4, lookup_tokens=10, max_tree_nodes=5)
    finally:
        hook.remove()
    assert max(query_lengths[1:]) <= 1 + 5 and query_lengths[0] <= prompt.shape[1] + 5  # the committed token + nodes


def test_sampling_plan_takes_depths_by_expected_tokens_per_node():
    class Linear:  # a round costs 1 + 0.1 per node
        def predict(self, nodes):
            return 1 + 0.1 * nodes

    drafter_rates, lookup_rates = torch.tensor([0.5, 0.5, 0.5]), [torch.tensor([0.9, 0.9]), torch.tensor([0.0, 1.0])]
    # without costs, as many as fit: the drafter's first depth (2 nodes) always, then the likeliest per node
    assert decoding.sampling_plan(drafter_rates, 2, lookup_rates, None, max_nodes=4) == (1, [2, 0])
    assert decoding.sampling_plan(drafter_rates, 2, lookup_rates, None, max_nodes=6) == (2, [2, 0])
    # with costs: the drafter's second depth adds 0.25 expected tokens for 2 nodes, 0.2 of a round
    assert decoding.sampling_plan(drafter_rates, 2, lookup_rates, Linear(), max_nodes=64) == (1, [2, 0])
    # a drafter that may not draft takes no depth; a lookup draft that is never accepted takes none
    assert decoding.sampling_plan(torch.tensor([]), 2, lookup_rates, Linear(), max_nodes=64) == (0, [2, 0])
    assert decoding.sampling_plan(torch.tensor([]), 2, [torch.tensor([0.0])], Linear(), max_nodes=64) == (0, [0])


def test_target_scores_process_each_row_with_its_path_when_read():
    from transformers.generation.logits_process import LogitsProcessorList, RepetitionPenaltyLogitsProcessor

    calls = []
    penalty = RepetitionPenaltyLogitsProcessor(2.0)  # depends on each row's context
    processor = LogitsProcessorList([lambda ids, scores: calls.append(ids.shape[0]) or penalty(ids, scores)])
    tree = decoding.DraftTree.from_drafts([[1, 2, 3], [1, 4]])
    input_ids, logits = torch.tensor([[5, 6]]), torch.randn(1 + len(tree), 8)
    scores = decoding.TargetScores(logits, input_ids, tree, tree.tokens, processor)
    expected = penalty(torch.tensor([[5, 6, 1, 2]]), logits[2][None].clone())[0]  # node 1: the path 1, 2
    assert torch.equal(scores[2], expected) and torch.equal(scores[2], expected)
    assert calls == [1]  # one row processed, once
    assert torch.equal(scores[0], penalty(input_ids, logits[0][None].clone())[0])


def test_tree_forwards_attend_over_grouped_heads_and_restore_the_setting(trained, monkeypatch):
    verifier, drafter = trained("llama")  # 4 query heads over 2 key/value heads
    monkeypatch.delenv("TRANSFORMERS_SDPA_FORCE_GQA", raising=False)
    sdpa, key_heads, verify = torch.nn.functional.scaled_dot_product_attention, [], decoding.TreeDecoding.verify
    in_tree = [False]

    def recording_sdpa(query, key, *args, **kwargs):
        if in_tree[0]:
            key_heads.append((key.shape[1], kwargs.get("enable_gqa", False)))
        return sdpa(query, key, *args, **kwargs)

    def recording_verify(self, round_, cache):  # a tree's forward (a chain's runs as plain decoding does)
        in_tree[0] = not round_.tree.is_chain
        return verify(self, round_, cache)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", recording_sdpa)
    monkeypatch.setattr(decoding.TreeDecoding, "verify", recording_verify)
    prompt = PROMPTS[:1]
    out = hf_specdiff.generate(verifier, drafter, prompt, max_new_tokens=20, do_sample=False, eos_token_id=None,
                               num_drafts=4)
    assert set(key_heads) == {(2, True)}  # no copied heads
    monkeypatch.setattr(decoding.TreeDecoding, "verify", verify)
    assert "TRANSFORMERS_SDPA_FORCE_GQA" not in os.environ
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", sdpa)
    assert out.tolist() == verifier.generate(prompt, max_new_tokens=20, do_sample=False, eos_token_id=None).tolist()
    monkeypatch.setenv("TRANSFORMERS_SDPA_FORCE_GQA", "0")  # the user's choice wins
    with decoding.grouped_heads_in_sdpa(verifier):
        assert os.environ["TRANSFORMERS_SDPA_FORCE_GQA"] == "0"


@pytest.mark.parametrize("arch", list(VERIFIERS))
@pytest.mark.parametrize("num_drafts", [1, 4])
def test_lookup_branch_greedy_equals_plain_and_adds_tokens(trained, arch, num_drafts):
    verifier, _ = trained(arch)
    drafter = tiny_drafter(verifier, block_size=16)  # untrained: the lookup branch carries the accepted tokens
    taus = {}
    for lookup_tokens, num_lookup_drafts in ((0, 1), (10, 1), (10, 3)):
        stats = hf_specdiff.SpecDiffStats()
        for prompt in PROMPTS[:3].split(1):
            plain = verifier.generate(prompt, max_new_tokens=40, do_sample=False, eos_token_id=None)
            out = hf_specdiff.generate(verifier, drafter, prompt, max_new_tokens=40, do_sample=False,
                                       eos_token_id=None, num_drafts=num_drafts, lookup_tokens=lookup_tokens,
                                       num_lookup_drafts=num_lookup_drafts, max_tree_nodes=16,
                                       stats=stats)  # a fixed tree: not sized by wall-clock
            assert out.tolist() == plain.tolist()
        taus[lookup_tokens, num_lookup_drafts] = stats.tau
    assert taus[10, 1] > taus[0, 1], taus  # tiny random verifiers repeat themselves: the lookup branch gets accepted
    assert taus[10, 3] > taus[0, 1], taus


def test_a_lookup_branch_pruned_away_after_misses_comes_back_when_it_is_right(trained, monkeypatch):
    """The lookup draft's rates are learnt from what the verifier commits, not only from the nodes the tree kept: after
    a run of wrong lookup drafts prunes the branch to nothing (plain steps), drafts that are right get it back."""
    verifier, _ = trained("llama")
    drafter = tiny_drafter(verifier, block_size=8)  # untrained: its nodes are too unlikely to be kept
    prompt = PROMPTS[:1]
    plain = verifier.generate(prompt, max_new_tokens=60, do_sample=False, eos_token_id=None)[0].tolist()
    calls = []

    def oracle(ids, num_tokens, num_drafts=1, max_ngram=3):  # the first 8 drafts wrong at their first token, then right
        calls.append(1)
        future = plain[ids.shape[0]:ids.shape[0] + num_tokens]
        return [[(t + 1) % 96 for t in future] if len(calls) <= 8 else future]

    monkeypatch.setattr(decoding, "prompt_lookup", oracle)
    profile = CostProfile({1: 1.0, 2: 1.3, 11: 1.5})  # a node is dear at first, the next ones cheap
    monkeypatch.setattr(RoundCosts, "record", lambda *args: None)  # no wall-clock in the test
    stats = hf_specdiff.SpecDiffStats()
    out = hf_specdiff.generate(verifier, drafter, prompt, max_new_tokens=60, do_sample=False, eos_token_id=None,
                               num_drafts=1, lookup_tokens=10, stats=stats, cost_profile=profile)
    assert out[0].tolist() == plain
    assert stats.rounds <= 30, stats.as_dict()  # 60 plain steps if the branch never came back


@pytest.mark.parametrize("decay,wasted", [(decoding.LOOKUP_ACCEPTANCE_DECAY, range(0, 13)), (1.0, range(25, 90))])
def test_a_lookup_branch_is_pruned_soon_after_a_copied_passage_ends(trained, monkeypatch, decay, wasted):
    """After 5 rounds whose lookup drafts were accepted whole, the copy ends: with recency decay the branch drops out
    of the tree after some wrong rounds (9 at the shipped 0.8, its deeper nodes being cheap here); counting every round
    alike, it stayed to the end (37 wrong rounds)."""
    verifier, _ = trained("llama")
    drafter = tiny_drafter(verifier, block_size=8)  # untrained: its nodes are too unlikely to be kept
    prompt = PROMPTS[:1]
    plain = verifier.generate(prompt, max_new_tokens=90, do_sample=False, eos_token_id=None)[0].tolist()
    calls, wrong_rounds_verified = [], []

    def oracle(ids, num_tokens, num_drafts=1, max_ngram=3):  # the first 5 drafts right, then wrong at their first token
        calls.append(1)
        future = plain[ids.shape[0]:ids.shape[0] + num_tokens]
        return [future if len(calls) <= 5 else [(t + 1) % 96 for t in future]]

    verify = decoding.TreeDecoding.verify

    def recorded_verify(self, round_, cache):
        if len(calls) > 5 and round_.tree.fixed_only:
            wrong_rounds_verified.append(len(calls))
        return verify(self, round_, cache)

    monkeypatch.setattr(decoding, "prompt_lookup", oracle)
    monkeypatch.setattr(decoding, "LOOKUP_ACCEPTANCE_DECAY", decay)
    monkeypatch.setattr(decoding.TreeDecoding, "verify", recorded_verify)
    monkeypatch.setattr(RoundCosts, "record", lambda *args: None)  # no wall-clock in the test
    out = hf_specdiff.generate(verifier, drafter, prompt, max_new_tokens=90, do_sample=False, eos_token_id=None,
                               num_drafts=1, lookup_tokens=10, cost_profile=CostProfile({1: 1.0, 2: 1.3, 11: 1.5}))
    assert out[0].tolist() == plain
    assert len(wrong_rounds_verified) in wasted, wrong_rounds_verified


def test_decayed_acceptance_follows_recent_rounds():
    steady, recent = AcceptanceRates(3), AcceptanceRates(3, decay=0.8)
    for rates in (steady, recent):
        for _ in range(20):
            rates.update(num_drafted=3, num_accepted=3)
        for _ in range(4):
            rates.update(num_drafted=3, num_accepted=0)
    assert steady.rates()[0] > 0.8 and recent.rates()[0] < 0.5
    assert AcceptanceRates(3, decay=0.8).rates().tolist() == [0.5] * 3  # untried: the prior, as without decay
    with pytest.raises(ValueError, match=r"decay must be in \(0, 1\]"):
        AcceptanceRates(3, decay=0.0)


def test_a_drafter_whose_remote_code_predates_the_lookup_decay_still_runs(trained, monkeypatch, caplog):
    """`custom_generate` ships apart from the drafter's remote code: an older drafter folder's `new_acceptance_rates`
    takes no `decay`; the loop then weighs every round alike, says so once, and still writes plain greedy's tokens."""
    verifier, drafter = trained("llama")
    made = []

    def new_acceptance_rates(max_length, first_prior=0.5):  # the signature before the decay
        made.append(AcceptanceRates(max_length, first_prior))
        return made[-1]

    monkeypatch.setattr(drafter, "new_acceptance_rates", new_acceptance_rates)
    plain = verifier.generate(PROMPTS[:1], max_new_tokens=30, do_sample=False, eos_token_id=None)
    with caplog.at_level("WARNING"):
        for _ in range(2):
            out = hf_specdiff.generate(verifier, drafter, PROMPTS[:1], max_new_tokens=30, do_sample=False,
                                       eos_token_id=None, num_drafts=4, lookup_tokens=10)
            assert out.tolist() == plain.tolist()
    assert len(made) == 2 * decoding.DEFAULT_NUM_LOOKUP_DRAFTS and {rates.decay for rates in made} == {1.0}
    assert caplog.text.count("predates the lookup drafts' recency weighting") == 1


def test_an_older_matchs_lookup_draft_starts_less_likely_than_the_latest(trained):
    verifier, drafter = trained("llama")
    ids = torch.tensor([5, 6, 7, 5, 6, 8, 5, 6, 9, 5, 6])  # "5 6" followed by 7, 8, 9: three lookup drafts
    tree_decoding = decoding.TreeDecoding(verifier, drafter, verifier.generation_config, [], [], num_drafts=1,
                                          draft_length=None, lookup_tokens=2, num_lookup_drafts=3,
                                          max_tree_nodes=None, streamer=None, stats=hf_specdiff.SpecDiffStats())
    lookups = decoding.prompt_lookup(ids, 2, 3)
    assert lookups == [[9, 5], [8, 5], [7, 5]]
    _, path_scores = tree_decoding.candidates(lookups, None)
    first = [round(math.exp(scores[0]), 3) for scores in path_scores]
    assert first == [0.5, 0.25, round(0.5 / 3, 3)]


@pytest.mark.parametrize("num_drafts", [1, 4])
def test_streamer_scores_and_dict_output(trained, num_drafts):
    verifier, drafter = trained("qwen2")
    streamer = CollectingStreamer()
    out = hf_specdiff.generate(verifier, drafter, PROMPTS[:1], max_new_tokens=30, do_sample=False,
                               eos_token_id=None, num_drafts=num_drafts, streamer=streamer,
                               return_dict_in_generate=True, output_scores=True)
    new = out.sequences[0, PROMPTS.shape[1]:].tolist()
    assert streamer.prompt == PROMPTS[0].tolist()  # the prompt first, as generate does (TextStreamer skips it)
    assert streamer.tokens == new and streamer.ended
    assert len(out.scores) == 30
    assert [int(s.argmax()) for s in out.scores] == new  # greedy: each token is the argmax of its scores


def test_custom_generate_folder_matches_callable(trained, tmp_path):
    verifier, drafter = trained("llama")
    folder = hf_specdiff.export_custom_generate(tmp_path / "specdiff-generate")
    kwargs = dict(max_new_tokens=30, do_sample=False, eos_token_id=None, drafter=drafter, num_drafts=4)
    expected = verifier.generate(PROMPTS[:1], custom_generate=hf_specdiff.specdiff_generate, **kwargs)
    got = verifier.generate(PROMPTS[:1], custom_generate=str(folder), trust_remote_code=True, **kwargs)
    assert got.tolist() == expected.tolist()


def test_errors(trained):
    verifier, drafter = trained("llama")
    with pytest.raises(ValueError, match="needs a drafter"):
        verifier.generate(PROMPTS[:1], custom_generate=hf_specdiff.specdiff_generate, max_new_tokens=4)
    with pytest.raises(ValueError, match="one prompt at a time"):
        hf_specdiff.generate(verifier, drafter, PROMPTS[:2], attention_mask=torch.ones_like(PROMPTS[:2]),
                             max_new_tokens=4, num_drafts=2)
    with pytest.raises(ValueError, match="max_tree_nodes must be >= 1, got 0"):
        hf_specdiff.generate(verifier, drafter, PROMPTS[:1], max_new_tokens=4, num_drafts=2, max_tree_nodes=0)
    with pytest.raises(ValueError, match="lookup_tokens must be >= 0, got -1"):
        hf_specdiff.generate(verifier, drafter, PROMPTS[:1], max_new_tokens=4, lookup_tokens=-1)
    with pytest.raises(ValueError, match="num_lookup_drafts must be >= 1, got 0"):
        hf_specdiff.generate(verifier, drafter, PROMPTS[:1], max_new_tokens=4, lookup_tokens=4, num_lookup_drafts=0)
    with pytest.raises(ValueError, match="draft_length must be between 1 and the drafter's longest draft"):
        hf_specdiff.generate(verifier, drafter, PROMPTS[:1], max_new_tokens=4, draft_length=17)
    other = tiny_drafter(tiny_verifier("llama", vocab_size=128))
    with pytest.raises(ValueError, match="vocab_size \\(128\\) differs"):
        hf_specdiff.generate(verifier, other, PROMPTS[:1], max_new_tokens=4, num_drafts=2)
    flash = copy.deepcopy(verifier)
    flash.config._attn_implementation = "flash_attention_2"
    with pytest.raises(ValueError, match="attn_implementation='sdpa'"):
        hf_specdiff.generate(flash, drafter, PROMPTS[:1], max_new_tokens=4, num_drafts=2)


# ---- sampling ------------------------------------------------------------------------------------------------

VOCAB = 8


@pytest.fixture(scope="module")
def small():
    verifier, prompt = sharp_verifier(VOCAB)
    # Close to the target but not equal: drafts are accepted about half the time, so both paths run.
    drafter = train_briefly(tiny_drafter(verifier, block_size=4), sampled_sequences(verifier, prompt, 64, 12), steps=40)
    return verifier, drafter, prompt, exact_first_two(verifier, prompt)


def sample_pairs(verifier, drafter, prompt, num_drafts, stats=None, lookup_tokens=0, temperature=1.0,
                 num_lookup_drafts=1):
    torch.manual_seed(1)
    pairs = []
    for _ in range(SAMPLES):
        out = hf_specdiff.generate(verifier, drafter, prompt, max_new_tokens=3, do_sample=True, top_k=None,
                                   temperature=temperature,
                                   eos_token_id=None, num_drafts=num_drafts, draft_length=2, stats=stats,
                                   lookup_tokens=lookup_tokens, num_lookup_drafts=num_lookup_drafts,
                                   max_tree_nodes=64)  # the whole tree, whatever rounds cost here
        pairs.append(out[0, prompt.shape[1]: prompt.shape[1] + 2])
    return torch.stack(pairs)


@pytest.mark.slow
@pytest.mark.parametrize("num_drafts", [1, 4])
def test_sampling_matches_target(small, num_drafts):
    verifier, drafter, prompt, exact = small
    stats = hf_specdiff.SpecDiffStats()
    assert chi_square_pvalue(sample_pairs(verifier, drafter, prompt, num_drafts, stats), exact) > 1e-3
    assert 0.2 < stats.acceptance_by_position[0] < 0.95  # both accept and reject paths ran


@pytest.fixture(scope="module")
def lookup_prompt(small):
    """A prompt that repeats its last token, so every first round holds a lookup draft, whose first token the
    verifier at temperature 2 gives a probability near 1/2: it is accepted about half the time."""
    verifier, _, prompt, _ = small
    candidates = [torch.cat([prompt, torch.tensor([[u, t, prompt[0, -1]]])], dim=1)
                  for u in range(VOCAB) for t in range(VOCAB)]
    with torch.no_grad():
        p_lookup = [float((verifier(c).logits[0, -1] / 2).softmax(-1)[decoding.prompt_lookup(c[0], 1)[0][0]])
                    for c in candidates]
    best = min(range(len(candidates)), key=lambda i: abs(p_lookup[i] - 0.5))
    assert 0.1 < p_lookup[best] < 0.9
    return candidates[best], exact_first_two(verifier, candidates[best], temperature=2.0)


@pytest.mark.slow
@pytest.mark.parametrize("num_drafts", [1, 4])
def test_sampling_with_lookup_branch_matches_target(small, lookup_prompt, num_drafts):
    verifier, drafter, _, _ = small
    prompt, exact = lookup_prompt
    pairs = sample_pairs(verifier, drafter, prompt, num_drafts, lookup_tokens=2, temperature=2.0)
    assert chi_square_pvalue(pairs, exact) > 1e-3


@pytest.fixture(scope="module")
def two_lookups_prompt(small):
    """A prompt whose last token occurs twice before it, followed by different tokens: two lookup drafts, whose first
    tokens the verifier at temperature 3 gives probabilities as near 1/2 each as it can."""
    verifier, _, prompt, _ = small
    last = int(prompt[0, -1])
    candidates = torch.cat([prompt.expand(VOCAB ** 3, -1), torch.tensor(
        [[u, t, last, s, last] for u in range(VOCAB) for t in range(VOCAB) for s in range(VOCAB)])], dim=1)
    with torch.no_grad():
        probs = (verifier(candidates).logits[:, -1] / 3).softmax(-1)
    drafts = [decoding.prompt_lookup(c, 1, num_drafts=2) for c in candidates]
    least = [min(float(p[d[0][0]]), float(p[d[1][0]])) if len(d) == 2 else 0.0 for p, d in zip(probs, drafts)]
    best = max(range(len(candidates)), key=least.__getitem__)
    assert least[best] > 0.15, least[best]
    prompt = candidates[best:best + 1]
    return prompt, exact_first_two(verifier, prompt, temperature=3.0)


@pytest.mark.slow
@pytest.mark.parametrize("tree", ["lookup drafts only", "with K=4 drafter draws"])
def test_sampling_with_two_lookup_drafts_matches_target(small, two_lookups_prompt, tree, monkeypatch):
    verifier, drafter, _, _ = small
    prompt, exact = two_lookups_prompt
    if tree == "lookup drafts only":  # every token comes from the lookup draws or the residual
        monkeypatch.setattr(DraftLengthPolicy, "next_length", lambda self, allow_skip=False: 0)
    num_drafts = 1 if tree == "lookup drafts only" else 4
    pairs = sample_pairs(verifier, drafter, prompt, num_drafts, lookup_tokens=2, temperature=3.0, num_lookup_drafts=2)
    assert chi_square_pvalue(pairs, exact) > 1e-3


@pytest.mark.slow
def test_chi_square_catches_an_unweighted_lookup_branch(small, lookup_prompt, monkeypatch):
    verifier, drafter, _, _ = small
    prompt, exact = lookup_prompt
    # wrong: accept the lookup token with probability min(1, p / q) for a made-up q, and subtract that q on rejection
    monkeypatch.setattr(decoding, "_point_mass", lambda token, like: torch.full_like(like, 1.0 / like.shape[-1]))
    pairs = sample_pairs(verifier, drafter, prompt, 1, lookup_tokens=2, temperature=2.0)
    assert chi_square_pvalue(pairs, exact) < 1e-3


@pytest.mark.slow
def test_chi_square_catches_a_wrong_acceptance_rule(small, monkeypatch):
    verifier, drafter, prompt, exact = small
    monkeypatch.setattr(decoding, "residual", lambda p, q: p)  # wrong: keep the target after a rejection
    assert chi_square_pvalue(sample_pairs(verifier, drafter, prompt, 4), exact) < 1e-3


def test_committed_custom_generate_folder_is_current():
    from pathlib import Path

    folder = Path(__file__).resolve().parents[1] / "model_cards" / "specdiff-generate"
    assert (folder / "custom_generate" / "generate.py").read_text() == Path(decoding.__file__).read_text(), \
        "regenerate with: python -c \"import hf_specdiff; hf_specdiff.export_custom_generate('model_cards/specdiff-generate')\""
    readme = (folder / "README.md").read_text()
    assert readme == hf_specdiff.tools.hub.CUSTOM_GENERATE_README
    import inspect

    own = [name for name, p in inspect.signature(decoding.generate).parameters.items()
           if p.kind is p.KEYWORD_ONLY or name == "drafter"]
    assert len(own) >= 7 and not [name for name in own if f"`{name}`" not in readme]  # every argument of ours


def test_draft_length_adapts_to_measured_acceptance():
    controller = DraftLengthPolicy(max_length=16)
    assert 1 < controller.next_length() < 16  # a first round verifies no long draft nothing is known of
    for _ in range(20):
        controller.update(num_drafted=controller.next_length(), num_accepted=1)  # always rejected at position 2
    assert controller.next_length() <= 3
    for _ in range(60):
        length = controller.next_length()
        controller.update(num_drafted=length, num_accepted=length)  # now everything is accepted
    assert controller.next_length() == 16
    assert DraftLengthPolicy(max_length=16, fixed=5).next_length() == 5


def test_top_k_drafts_are_the_k_most_probable_sequences():
    import itertools

    torch.manual_seed(0)
    log_q = torch.randn(3, 6).log_softmax(-1)
    log_q[1, 2] = float("-inf")  # outside a reduced draft vocabulary
    best = sorted(itertools.product(range(6), repeat=3), key=lambda seq: -sum(log_q[i, t] for i, t in enumerate(seq)))
    drafts, path_scores = decoding.top_k_drafts(log_q, 5)
    assert drafts == [list(seq) for seq in best[:5]]
    for draft, scores in zip(drafts, path_scores):  # each prefix's log-probability under the marginals
        expected = log_q[torch.arange(3), torch.tensor(draft)].double().cumsum(0)
        assert torch.allclose(torch.tensor(scores, dtype=torch.float64), expected)
    assert decoding.top_k_drafts(log_q, 1)[0] == [log_q.argmax(-1).tolist()]


def test_unreached_draft_positions_take_the_last_measured_rate():
    assert AcceptanceRates(max_length=5).rates().tolist() == [0.5] * 5  # untried: accepted half the time
    controller = AcceptanceRates(max_length=5, first_prior=1.0)
    assert controller.rates().tolist() == [1.0] * 5
    controller.update(num_drafted=5, num_accepted=1)  # position 1 accepted, position 2 rejected, 3-5 not reached
    assert controller.rates().tolist() == [1.0, 0.5, 0.5, 0.5, 0.5]
