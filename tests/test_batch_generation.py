"""Batched data generation: rows leave the batch when they finish, outputs stay those of plain decoding."""

import pytest
import torch
from scipy.stats import chisquare
from transformers import TopPLogitsWarper

from hf_specdiff.training.batch_generation import generate_batch, sample_tokens
from helpers import sharp_verifier, tiny_verifier
from stats import chi_square_pvalue


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_greedy_rows_equal_plain_greedy_and_stop_at_eos(arch):
    verifier = tiny_verifier(arch)
    prompts = [[5, 9, 14], [7, 3, 22, 41, 8, 9], [30], [11, 12, 13, 14]]
    plain = [verifier.generate(torch.tensor([p]), max_new_tokens=24, do_sample=False, eos_token_id=None)[0, len(p):]
             .tolist() for p in prompts]
    eos = plain[0][5]  # a token that ends some rows early
    expected = [row[: row.index(eos) + 1] if eos in row else row for row in plain]
    assert any(len(row) < 24 for row in expected) and any(len(row) == 24 for row in expected)
    assert generate_batch(verifier, prompts, 24, {eos}, pad_id=0).responses == expected
    assert generate_batch(verifier, [prompts[1]] * 3, 24, {eos}, pad_id=0).responses == [expected[1]] * 3  # read once
    generation = generate_batch(verifier, prompts + [prompts[1]], 24, {eos}, pad_id=0, output_hidden_states=[1, -1])
    assert generation.responses == expected + [expected[1]]
    for prompt, response, states in zip(prompts + [prompts[1]], generation.responses, generation.hidden_states):
        with torch.no_grad():  # what a teacher-forced forward over prompt + response gives, last token included
            out = verifier(torch.tensor([prompt + response]), output_hidden_states=True)
        forced = torch.cat([out.hidden_states[1], out.hidden_states[-1]], dim=-1)[0]
        assert states.dtype == torch.bfloat16 and states.shape == forced.shape
        torch.testing.assert_close(states.float(), forced, rtol=2e-2, atol=2e-2)
    same = generate_batch(verifier, [prompts[1]] * 2, 24, {eos}, pad_id=0, output_hidden_states=[1, -1])
    for states in same.hidden_states:  # the prompt read once, its states given to both rows
        torch.testing.assert_close(states.float(), generation.hidden_states[1].float(), rtol=2e-2, atol=2e-2)


def test_sampling_is_reproducible_and_distributed_as_the_model():
    verifier, prompt = sharp_verifier(vocab_size=8)
    rows = [prompt[0].tolist()] * 3000

    def sample(seed):
        return generate_batch(verifier, rows, 2, set(), pad_id=0, temperature=1.0,
                              generator=torch.Generator().manual_seed(seed)).responses

    first = sample(0)
    assert first == sample(0) and first != sample(1)
    with torch.no_grad():
        p1 = verifier(prompt).logits[0, -1].double().softmax(-1)
        seconds = torch.cat([prompt.expand(8, -1), torch.arange(8)[:, None]], dim=1)
        exact = p1[:, None] * verifier(seconds).logits[:, -1].double().softmax(-1)
    assert chi_square_pvalue(torch.tensor(first), exact) > 1e-3


def test_bad_input():
    with pytest.raises(ValueError, match="at least one token"):
        generate_batch(tiny_verifier("llama"), [[5], []], 4, set(), pad_id=0)


@pytest.mark.parametrize("candidates", [3, 6, 64])  # both rows' nuclei past the candidates, one row's, neither's
def test_sample_tokens_draws_from_the_top_p_nucleus(candidates):
    peaked = torch.tensor([3.0, 2.5, 2.0, 1.2, 0.5, 0.0, -1.0, -2.0])
    kinds = (peaked, peaked / 3)
    draws = sample_tokens(torch.stack(kinds).repeat(10000, 1), 1.5, 0.9, torch.Generator().manual_seed(0), candidates)
    for kind, logits in enumerate(kinds):
        nucleus = TopPLogitsWarper(0.9)(None, logits[None] / 1.5).double().softmax(-1)[0]
        assert int((nucleus > 0).sum()) == (5, 7)[kind]
        observed = torch.bincount(draws[kind::2], minlength=8).double()
        assert observed[nucleus == 0].sum() == 0
        assert chisquare(observed[nucleus > 0], nucleus[nucleus > 0] * 10000).pvalue > 1e-3
        without_top_p = (logits / 1.5).double().softmax(-1)  # the test tells the two apart
        assert chisquare(observed, without_top_p * 10000).pvalue < 1e-6
