"""Bad input gets an error that names the fix."""

import pytest
import torch

from hf_specdiff import SpecDiffDrafter, check_compatibility
from helpers import tiny_drafter, tiny_verifier

PROMPT = torch.tensor([[5, 9, 14, 3]])


def test_vocab_mismatch():
    verifier = tiny_verifier("llama", vocab_size=96)
    drafter = tiny_drafter(tiny_verifier("llama", vocab_size=128))
    with pytest.raises(ValueError, match="vocab_size \\(128\\) differs from the verifier's \\(96\\)"):
        check_compatibility(verifier, drafter)
    with pytest.raises(ValueError, match="different tokenizers"):  # transformers' own check on the drop-in path
        verifier.generate(PROMPT, max_new_tokens=5, assistant_model=drafter)
    small = tiny_drafter(tiny_verifier("llama", vocab_size=8))
    with pytest.raises(ValueError, match="outside the drafter's vocabulary"):
        small.generate(PROMPT, max_new_tokens=2)


def test_special_token_mismatch():
    verifier = tiny_verifier("llama")
    drafter = tiny_drafter(verifier)
    drafter.config.eos_token_id = 7
    with pytest.raises(ValueError, match="eos_token_id .* differs .*drafter.config.eos_token_id"):
        check_compatibility(verifier, drafter)


def test_draft_longer_than_block():
    verifier = tiny_verifier("llama")
    drafter = tiny_drafter(verifier, block_size=4)
    drafter.generation_config.num_assistant_tokens = 6
    with pytest.raises(ValueError, match="at most block_size=4.*num_assistant_tokens"):
        verifier.generate(PROMPT, max_new_tokens=20, assistant_model=drafter)
    with pytest.raises(ValueError, match="at most block_size=4"):
        drafter.generate(PROMPT, max_new_tokens=5)


def test_batch_and_padding():
    drafter = tiny_drafter(tiny_verifier("llama"))
    with pytest.raises(ValueError, match="one sequence at a time"):
        drafter.generate(PROMPT.repeat(2, 1), max_new_tokens=2)
    with pytest.raises(ValueError, match="padded inputs"):
        drafter.generate(PROMPT, attention_mask=torch.tensor([[0, 1, 1, 1]]), max_new_tokens=2)


def test_checkpoint_of_another_model_type(tmp_path):
    tiny_verifier("llama").save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="is a 'llama' model, not a SpecDiff drafter"):
        SpecDiffDrafter.from_pretrained(tmp_path)


def test_bad_config_values():
    from hf_specdiff import SpecDiffConfig

    with pytest.raises(ValueError, match="unmasking_schedule"):
        SpecDiffConfig(unmasking_schedule="random")
    with pytest.raises(ValueError, match="smaller than max_position_embeddings"):
        SpecDiffConfig(block_size=64, max_position_embeddings=64)
