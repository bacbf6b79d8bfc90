"""The training objectives against hand-computed values, and the training layout against drafting."""

import math

import torch

from hf_specdiff.training.block_diffusion import block_attention_pattern, block_logits, make_block_diffusion_batch
from hf_specdiff.generation_specdiff import SpecDiffCache
from hf_specdiff.training.objectives import (ce_streak_loss, expected_streak, kl_position_weights, kl_to_verifier, mdlm_loss,
                                    streak_loss, top_k_kl_to_verifier)
from helpers import tiny_drafter, tiny_verifier


def logits_for(probs: list[float]) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits [1, n, 2] whose softmax gives the target (index 0) probability probs[i] at position i."""
    p = torch.tensor(probs)
    return torch.stack([p.log(), (1 - p).log()], dim=-1)[None], torch.zeros(1, len(probs), dtype=torch.long)


def test_streak_by_hand():
    logits, targets = logits_for([0.5, 0.25, 0.8])
    streak = 0.5 + 0.5 * 0.25 + 0.5 * 0.25 * 0.8
    assert math.isclose(expected_streak(logits, targets).item(), streak, rel_tol=1e-6)
    assert math.isclose(streak_loss(logits, targets).item(), -streak, rel_tol=1e-6)
    ce = -(1 * math.log(0.5) + 0.5 * math.log(0.25) + 0.125 * math.log(0.8))
    assert math.isclose(ce_streak_loss(logits, targets).item(), ce, rel_tol=1e-6)


def test_mdlm_by_hand():
    logits, targets = logits_for([0.5, 0.25, 0.8, 0.9])
    masked = torch.tensor([[True, False, True, True]])
    ratio = torch.tensor([[0.5, 0.5, 0.25, 0.25]])
    expected = (-math.log(0.5) / 0.5 - math.log(0.8) / 0.25 - math.log(0.9) / 0.25) / 4
    assert math.isclose(mdlm_loss(logits, targets, masked, ratio).item(), expected, rel_tol=1e-6)


def test_streak_gradient_favours_early_positions():
    q = torch.tensor([0.6, 0.6, 0.6, 0.6], requires_grad=True)
    logits = torch.stack([q.log(), (1 - q).log()], dim=-1)[None]
    expected_streak(logits, torch.zeros(1, 4, dtype=torch.long)).sum().backward()
    grad = q.grad.tolist()
    assert grad[0] > grad[1] > grad[2] > grad[3] > 0


def test_targets_outside_the_draft_vocabulary():
    logits, _ = logits_for([0.5, 0.5, 0.5])
    logits.requires_grad_(True)
    targets = torch.tensor([[0, -1, 0]])  # position 2 cannot be drafted: the streak stops there
    assert math.isclose(expected_streak(logits, targets).item(), 0.5, rel_tol=1e-5)
    (streak_loss(logits, targets) + ce_streak_loss(logits, targets)).backward()
    assert torch.isfinite(logits.grad).all() and logits.grad[0, 1].abs().sum() == 0



def test_kl_weighted_by_position_and_from_the_verifiers_top_k():
    """Uniform and streak weighting by hand; the top-k KL is the KL to the verifier's renormalised top k, skips
    tokens outside the drafter's head and padding, and equals the full KL when k is the whole vocabulary."""
    gen = torch.Generator().manual_seed(0)
    logits, verifier_logits = torch.randn(2, 3, 5, generator=gen), torch.randn(2, 3, 5, generator=gen)
    targets, masked = torch.tensor([[0, 1, 2], [3, -1, 4]]), torch.ones(2, 3, dtype=torch.bool)
    uniform = kl_position_weights("uniform", logits, targets, masked)
    assert uniform.tolist() == [[1, 1, 1], [1, 0, 1]]
    q = logits.softmax(-1)
    reach = kl_position_weights("streak", logits, targets, masked)
    torch.testing.assert_close(reach[0], torch.stack([torch.tensor(1.0), q[0, 0, 0], q[0, 0, 0] * q[0, 1, 1]]))
    assert reach[1, 1] == 0 and reach[1, 2] == 0  # the streak cannot pass a token outside the head
    p_full = verifier_logits.softmax(-1)
    kl = (p_full * (p_full.log() - q.log())).sum(-1)
    torch.testing.assert_close(kl_to_verifier(logits, verifier_logits, reach), (kl * reach).sum() / reach.sum())
    top_log_probs, top_ids = verifier_logits.log_softmax(-1).topk(5, dim=-1)
    torch.testing.assert_close(top_k_kl_to_verifier(logits, top_ids, top_log_probs, uniform),
                               kl_to_verifier(logits, verifier_logits, uniform))
    top_ids[0, 0, 1:] = -1  # position (0, 0): only its likeliest token is in the head; position (0, 1): padding
    top_log_probs[0, 1] = float("-inf")
    logits.requires_grad_(True)
    loss = top_k_kl_to_verifier(logits, top_ids, top_log_probs, uniform)
    rest = [kl[0, 2], kl[1, 0], kl[1, 2]]
    torch.testing.assert_close(loss, (-q[0, 0, top_ids[0, 0, 0]].log() + sum(rest)) / 4)
    loss.backward()
    assert torch.isfinite(logits.grad).all() and logits.grad[0, 1].abs().sum() == 0


def test_block_pattern():
    mask = block_attention_pattern(6, 2, 1)[0, 0].int()
    clean_clean = mask[:6, :6]
    assert torch.equal(clean_clean, torch.ones(6, 6, dtype=torch.int).tril())
    assert mask[:6, 6:].sum() == 0  # clean tokens never see noised ones
    # noised token 3 (block [3, 4]) sees clean 0..2 and noised 3..4
    assert mask[6 + 3].tolist() == [1, 1, 1, 0, 0, 0, 0, 0, 0, 1, 1, 0]


def test_training_layout_matches_drafting():
    """The logits a block gets in the one-forward training layout equal those of drafting it with the cache."""
    verifier = tiny_verifier("llama")
    drafter = tiny_drafter(verifier, block_size=4)
    clean = torch.randint(3, 96, (1, 15))
    batch = make_block_diffusion_batch(clean, 4, drafter.config.mask_token_index, "full",
                                       torch.Generator().manual_seed(3))
    train_logits = block_logits(drafter, batch)  # [1, blocks, 4, V]
    start = batch.block_slice.start
    for b in range(train_logits.shape[1]):
        prefix = clean[:, : start + 4 * b]
        block = torch.full((1, 4), drafter.config.mask_token_index)
        cache = SpecDiffCache()
        drafter(prefix, past_key_values=cache, num_prefix_tokens=prefix.shape[1])
        positions = torch.arange(prefix.shape[1], prefix.shape[1] + 4)[None]
        draft_logits = drafter(block, position_ids=positions, past_key_values=cache,
                               attention_mask=torch.ones(1, 1, 4, prefix.shape[1] + 4, dtype=torch.bool)).logits
        torch.testing.assert_close(train_logits[0, b], draft_logits[0], rtol=1e-4, atol=1e-4)
