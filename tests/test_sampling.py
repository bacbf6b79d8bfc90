"""Assisted sampling with the drafter is distributed exactly as sampling from the verifier."""

import pytest
import torch
from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopPLogitsWarper

import hf_specdiff.costs_specdiff as costs
import hf_specdiff.generation_specdiff as generation
import hf_specdiff.policies_specdiff as policies
from helpers import sampled_sequences, sharp_verifier, tiny_drafter, train_briefly
from stats import SAMPLES, chi_square_pvalue, exact_first_two

VOCAB = 8
pytestmark = pytest.mark.slow  # statistical: SAMPLES generations a test


def sample_pairs(verifier, drafter, prompt):
    pairs = []
    for _ in range(SAMPLES):
        out = verifier.generate(prompt, max_new_tokens=3, do_sample=True, top_k=None, eos_token_id=None,
                                assistant_model=drafter)
        pairs.append(out[0, prompt.shape[1]: prompt.shape[1] + 2])
    return torch.stack(pairs)


@pytest.fixture(scope="module")
def setup():
    verifier, prompt = sharp_verifier(VOCAB)
    return verifier, prompt, exact_first_two(verifier, prompt)


@pytest.mark.parametrize("steps,draft_vocab", [(1, None), (2, None), (1, [1, 4, 6, 0])])
def test_assisted_sampling_matches_target(setup, steps, draft_vocab):
    verifier, prompt, exact = setup
    # Close to the target but not equal: drafts are accepted about half the time, so both paths run.
    # With a reduced draft vocabulary, q is zero outside it: tokens outside come from the residual.
    drafter = tiny_drafter(verifier, block_size=4, num_denoising_steps=steps, draft_token_ids=draft_vocab)
    train_briefly(drafter, sampled_sequences(verifier, prompt, 64, 12), steps=40, noise="suffix")
    torch.manual_seed(1)
    assert chi_square_pvalue(sample_pairs(verifier, drafter, prompt), exact) > 1e-3


def test_top_p_warper_among_candidates_keeps_transformers_nucleus(monkeypatch):
    monkeypatch.setattr(generation.CandidateTopPLogitsWarper, "candidates", 16)
    torch.manual_seed(0)
    logits = torch.cat([torch.randn(6, 64) * 4, torch.randn(2, 64) * 1e-3])  # near-flat rows: nucleus over 16 tokens
    for top_p, keep in ((0.9, 1), (0.5, 1), (0.05, 3)):
        expected = TopPLogitsWarper(top_p, min_tokens_to_keep=keep)(None, logits)
        processed = generation.CandidateTopPLogitsWarper(top_p, min_tokens_to_keep=keep)(None, logits)
        assert torch.equal(processed.isinf(), expected.isinf())
        assert torch.equal(processed[~processed.isinf()], logits[~expected.isinf()])
    processors = generation.draft_processors(LogitsProcessorList([TemperatureLogitsWarper(0.7), TopPLogitsWarper(0.9)]))
    assert [type(p) for p in processors] == [TemperatureLogitsWarper, generation.CandidateTopPLogitsWarper]


def test_top_p_sampling_matches_target_with_the_drafts_nucleus_among_candidates(setup, monkeypatch):
    verifier, prompt, _ = setup
    monkeypatch.setattr(generation.CandidateTopPLogitsWarper, "candidates", 3)  # of the 8 tokens: both branches run
    drafter = tiny_drafter(verifier, block_size=4)
    train_briefly(drafter, sampled_sequences(verifier, prompt, 64, 12), steps=40, noise="suffix")
    torch.manual_seed(1)
    sampling = dict(max_new_tokens=3, do_sample=True, top_k=None, top_p=0.8, temperature=3.0, eos_token_id=None)
    pairs = torch.stack([verifier.generate(prompt, **sampling, assistant_model=drafter)[0, prompt.shape[1]:][:2]
                         for _ in range(SAMPLES)])
    assert chi_square_pvalue(pairs, exact_first_two(verifier, prompt, temperature=3.0, top_p=0.8)) > 1e-3


def test_chi_square_catches_a_biased_drafter(setup, monkeypatch):
    verifier, prompt, exact = setup
    drafter = tiny_drafter(verifier, block_size=4)  # unsure: its argmax is far from a sample
    # Deliberately wrong: draft the argmax but report the softmax as the distribution it was drawn from.
    monkeypatch.setattr(generation, "select_tokens", lambda scores, do_sample, generator=None: scores.argmax(-1))
    torch.manual_seed(1)
    assert chi_square_pvalue(sample_pairs(verifier, drafter, prompt), exact) < 1e-3


@pytest.fixture(scope="module")
def lookup_setup(setup):
    """A prompt that repeats its last token, so the drop-in path's lookup draft exists from the first round, whose
    first token the verifier at temperature 2 gives a probability near 1/2; a drafter whose drafting never pays, so
    every round that can proposes the lookup draft."""
    verifier, prompt, _ = setup
    candidates = [torch.cat([prompt, torch.tensor([[u, t, prompt[0, -1]]])], dim=1)
                  for u in range(VOCAB) for t in range(VOCAB)]
    with torch.no_grad():
        p_lookup = [float((verifier(c).logits[0, -1] / 2).softmax(-1)[c[0, policies.prompt_lookup_match(c[0])[1]]])
                    for c in candidates]
    best = min(range(len(candidates)), key=lambda i: abs(p_lookup[i] - 0.5))
    assert 0.1 < p_lookup[best] < 0.9
    drafter = tiny_drafter(verifier, block_size=4).attach(verifier)
    # verified tokens cheap, the drafter's call dear: lookup drafts pay, the drafter's do not
    profile = costs.CostProfile({1: 1.0, 2: 1.05, 3: 1.1, 4: 1.15, 5: 1.2}, drafter={1: 2.0, 3: 2.0})
    costs.set_cost_profile(verifier, drafter, profile)
    return drafter, candidates[best], exact_first_two(verifier, candidates[best], temperature=2.0)


def sample_lookup_pairs(verifier, drafter, prompt):
    torch.manual_seed(1)
    return torch.stack([verifier.generate(prompt, max_new_tokens=3, do_sample=True, top_k=None, temperature=2.0,
                                          eos_token_id=None, assistant_model=drafter)[0, prompt.shape[1]:][:2]
                        for _ in range(SAMPLES)])


def test_drop_in_lookup_rounds_sample_the_target(setup, lookup_setup, monkeypatch):
    verifier = setup[0]
    drafter, prompt, exact = lookup_setup
    rounds = []  # each generation's round tracker, which holds its policies
    init = policies.AssistantRounds.__init__
    monkeypatch.setattr(policies.AssistantRounds, "__init__", lambda self, *a: rounds.append(self) or init(self, *a))
    pairs = sample_lookup_pairs(verifier, drafter, prompt)
    assert chi_square_pvalue(pairs, exact) > 1e-3
    assert sum(float(p.acceptance.reached[0]) for r in rounds for p in r.lookup_policies) > 0  # lookup rounds ran


def test_chi_square_catches_lookup_rounds_scored_as_uniform(setup, lookup_setup, monkeypatch):
    import hf_specdiff.modeling_specdiff as modeling

    verifier = setup[0]
    drafter, prompt, exact = lookup_setup
    # wrong: report the lookup draft as drawn from a uniform distribution instead of a point mass
    monkeypatch.setattr(modeling, "point_mass_scores", lambda draft, vocab: tuple(
        torch.zeros(1, vocab) for _ in range(draft.shape[1])))
    assert chi_square_pvalue(sample_lookup_pairs(verifier, drafter, prompt), exact) < 1e-3
