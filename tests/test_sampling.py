"""Assisted sampling with the drafter is distributed exactly as sampling from the verifier."""

import pytest
import torch

import hf_specdiff.generation_specdiff as generation
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


def test_chi_square_catches_a_biased_drafter(setup, monkeypatch):
    verifier, prompt, exact = setup
    drafter = tiny_drafter(verifier, block_size=4)  # unsure: its argmax is far from a sample
    # Deliberately wrong: draft the argmax but report the softmax as the distribution it was drawn from.
    monkeypatch.setattr(generation, "select_tokens", lambda scores, do_sample, generator=None: scores.argmax(-1))
    torch.manual_seed(1)
    assert chi_square_pvalue(sample_pairs(verifier, drafter, prompt), exact) < 1e-3
