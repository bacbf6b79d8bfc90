"""Training objectives for diffusion drafters, as pure functions of block logits and targets.

Shapes: `logits` [..., block_size, vocab], `targets` [..., block_size]; leading dims are blocks.
"""

import torch
import torch.nn.functional as F


IMPOSSIBLE = -1e4  # log q of a target the drafter cannot emit (index -1: outside a reduced draft vocabulary)


def target_log_probs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log q_j(x_j): the drafter's log-probability of each target token, [..., block_size].

    Targets of -1 (tokens outside the draft vocabulary) get `IMPOSSIBLE`, with no gradient.
    """
    valid = targets >= 0
    log_q = torch.log_softmax(logits.float(), dim=-1).gather(-1, targets.clamp_min(0).unsqueeze(-1)).squeeze(-1)
    return log_q.masked_fill(~valid, IMPOSSIBLE)


def expected_streak(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """E[accepted streak] = sum_m prod_{j<=m} q_j(x_j) per block, [...] (SpecDiff-2's streak)."""
    return target_log_probs(logits, targets).cumsum(-1).exp().sum(-1)


def streak_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """SpecDiff-2 streak distillation: minus the mean expected accepted streak over blocks."""
    return -expected_streak(logits, targets).mean()


def reach_probabilities(log_q: torch.Tensor) -> torch.Tensor:
    """prod_{i<j} q_i(x_i) per block position j, without gradient: the probability that drafting reaches j."""
    return torch.cat([torch.zeros_like(log_q[..., :1]), log_q[..., :-1].cumsum(-1)], dim=-1).exp().detach()


def ce_streak_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Streak-weighted cross-entropy: sum_j stopgrad(prod_{i<j} q_i) * (-log q_j), averaged over blocks.

    Same stationary point as `streak_loss` per position, but log-scaled, so early training (q tiny) still moves.
    """
    log_q = target_log_probs(logits, targets)
    return -(reach_probabilities(log_q) * log_q * (targets >= 0)).sum(-1).mean()


def mdlm_loss(logits: torch.Tensor, targets: torch.Tensor, masked: torch.Tensor, mask_ratio: torch.Tensor) -> torch.Tensor:
    """Masked-diffusion ELBO: cross-entropy on masked tokens weighted by 1/t (t = the block's mask ratio),
    divided by the number of tokens."""
    nll = -target_log_probs(logits, targets)
    weight = (masked & (targets >= 0)).float() / mask_ratio
    return (nll * weight).sum() / targets.numel()


def kl_to_verifier(logits: torch.Tensor, verifier_logits: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """KL(p_verifier || q_drafter) per block position, averaged with `weights` [..., block_size]."""
    log_q = torch.log_softmax(logits.float(), dim=-1)
    log_p = torch.log_softmax(verifier_logits.float(), dim=-1)
    kl = F.kl_div(log_q, log_p, log_target=True, reduction="none").sum(-1)
    return (kl * weights).sum() / weights.sum().clamp_min(1e-12)


def top_k_kl_to_verifier(logits: torch.Tensor, top_ids: torch.Tensor, top_log_probs: torch.Tensor,
                         weights: torch.Tensor) -> torch.Tensor:
    """`kl_to_verifier` with the verifier's distribution cut to its k likeliest tokens (`top_ids` [..., k] in the
    drafter's head, -1 where a token is outside it; `top_log_probs` [..., k], -inf on padding) and renormalised
    over them."""
    kept = (top_ids >= 0) & top_log_probs.isfinite()
    log_p = torch.log_softmax(top_log_probs.float().masked_fill(~kept, float("-inf")), dim=-1).masked_fill(~kept, 0.0)
    log_q = torch.log_softmax(logits.float(), dim=-1).gather(-1, top_ids.clamp_min(0))
    kl = (log_p.exp() * kept * (log_p - log_q)).sum(-1)
    weights = weights * kept.any(-1)
    return (kl * weights).sum() / weights.sum().clamp_min(1e-12)


def kl_position_weights(scheme: str, logits: torch.Tensor, targets: torch.Tensor, masked: torch.Tensor) -> torch.Tensor:
    """How the KL term weighs block positions: `"uniform"` (every masked position alike) or `"streak"` (position j by
    the probability that the drafter's streak reaches it, prod_{i<j} q_i(x_i), as the streak objective does)."""
    weights = (masked & (targets >= 0)).float()
    if scheme == "streak":
        weights = weights * reach_probabilities(target_log_probs(logits, targets))
    elif scheme != "uniform":
        raise ValueError(f"kl_weighting must be one of {KL_WEIGHTINGS}, got {scheme!r}")
    return weights


OBJECTIVES = ("streak", "ce-streak", "mdlm")
KL_WEIGHTINGS = ("uniform", "streak")
