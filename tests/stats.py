"""Chi-square test of sampled token pairs against an exact distribution."""

import torch
from scipy.stats import chisquare


def exact_first_two(verifier, prompt: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Exact joint distribution [V, V] of the first two tokens sampled from `verifier` after `prompt` [1, L]."""
    with torch.no_grad():
        p1 = (verifier(prompt).logits[0, -1].double() / temperature).softmax(-1)
        vocab = p1.shape[0]
        seconds = torch.cat([prompt.expand(vocab, -1), torch.arange(vocab)[:, None]], dim=1)
        p2 = (verifier(seconds).logits[:, -1].double() / temperature).softmax(-1)
    return p1[:, None] * p2


def chi_square_pvalue(pairs: torch.Tensor, exact: torch.Tensor) -> float:
    """p-value that `pairs` [N, 2] were drawn from `exact` [V, V]; cells expected < 5 are pooled."""
    vocab = exact.shape[0]
    observed = torch.bincount(pairs[:, 0] * vocab + pairs[:, 1], minlength=vocab * vocab).double()
    expected = exact.flatten() * pairs.shape[0]
    small = expected < 5
    observed = torch.cat([observed[~small], observed[small].sum()[None]])
    expected = torch.cat([expected[~small], expected[small].sum()[None]])
    return float(chisquare(observed.numpy(), expected.numpy() * observed.sum().item() / expected.sum().item()).pvalue)
