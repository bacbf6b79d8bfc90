"""A bitsandbytes-quantized verifier (the `quant` extra; 8-bit and 4-bit run on CPU with bitsandbytes 0.50): every path
gives the quantized verifier's own plain greedy output, token for token."""

import importlib.util

import pytest
import torch

import hf_specdiff
from helpers import PROMPTS, greedy_sequences, tiny_drafter, tiny_verifier, train_briefly

pytestmark = pytest.mark.skipif(importlib.util.find_spec("bitsandbytes") is None,
                                reason="bitsandbytes is not installed (pip install -e '.[quant]')")


def quantized_verifier(folder, bits: int):
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    tiny_verifier("llama").save_pretrained(folder)
    config = BitsAndBytesConfig(load_in_8bit=True) if bits == 8 else BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.float32)
    return AutoModelForCausalLM.from_pretrained(folder, quantization_config=config, device_map="cpu").eval()


@pytest.fixture(scope="module")
def drafters():
    """A standalone and a conditioned drafter trained briefly on the unquantized verifier's greedy outputs (cheaper
    than the quantized one's, and close enough to be accepted)."""
    verifier = tiny_verifier("llama")
    sequences = greedy_sequences(verifier, PROMPTS, 32)
    return (train_briefly(tiny_drafter(verifier, block_size=8), sequences, steps=80),
            train_briefly(tiny_drafter(verifier, block_size=8, conditioned=True), sequences, steps=80,
                          verifier=verifier))


@pytest.mark.slow
@pytest.mark.parametrize("bits", [8, 4])
def test_every_path_equals_the_quantized_verifiers_greedy(tmp_path, drafters, bits):
    verifier = quantized_verifier(tmp_path, bits)
    assert "bit" in type(verifier.model.layers[0].mlp.up_proj).__name__  # Linear8bitLt / Linear4bit
    drafter, conditioned = drafters
    kwargs = dict(max_new_tokens=16, do_sample=False, eos_token_id=None)
    stats = hf_specdiff.SpecDiffStats()
    prompt = PROMPTS[:1]
    plain = verifier.generate(prompt, **kwargs).tolist()
    assert verifier.generate(prompt, assistant_model=drafter, **kwargs).tolist() == plain
    assert verifier.generate(prompt, assistant_model=conditioned.attach(verifier), **kwargs).tolist() == plain
    conditioned.detach()
    for model in (drafter, conditioned):
        for options in ({}, {"num_drafts": 4}, {"lookup_tokens": 4}):
            out = hf_specdiff.generate(verifier, model, prompt, stats=stats, **options, **kwargs)
            assert out.tolist() == plain, (model.config.is_conditioned, options)
    assert stats.acceptance_by_position[0] > 0.1  # drafts were accepted (4-bit: 0.17), so verification was exercised
