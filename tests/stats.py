"""Chi-square test of sampled token pairs against an exact distribution."""

import torch
from scipy.stats import chisquare
from transformers import TopPLogitsWarper

# Generations per chi-square test. Sized by power: the deliberate bugs the `*_catches_*` tests plant shift the
# joint of the first two tokens (8 x 8 cells) by a noncentrality of 0.13-0.28 per generation (measured at 1,200
# generations: chi-square 161-360 on 7-24 degrees of freedom). At 400 generations the test at p < 1e-3 rejects the
# weakest of them with probability 0.997 (scipy ncx2), so a correctness test of the same size would catch such a bug too.
SAMPLES = 400


def exact_first_two(verifier, prompt: torch.Tensor, temperature: float = 1.0, top_p: float = 1.0) -> torch.Tensor:
    """Exact joint distribution [V, V] of the first two tokens sampled from `verifier` after `prompt` [1, L] (with
    transformers' top-p warper where `top_p` < 1)."""
    def probs(logits):
        scores = logits / temperature
        return (TopPLogitsWarper(top_p)(None, scores) if top_p < 1 else scores).double().softmax(-1)

    with torch.no_grad():
        p1 = probs(verifier(prompt).logits[0, -1:])[0]
        vocab = p1.shape[0]
        seconds = torch.cat([prompt.expand(vocab, -1), torch.arange(vocab)[:, None]], dim=1)
        p2 = probs(verifier(seconds).logits[:, -1])
    return p1[:, None] * p2


def chi_square_pvalue(pairs: torch.Tensor, exact: torch.Tensor) -> float:
    """p-value that `pairs` [N, 2] were drawn from `exact` [V, V]; cells expected < 5 are pooled."""
    vocab = exact.shape[0]
    observed = torch.bincount(pairs[:, 0] * vocab + pairs[:, 1], minlength=vocab * vocab).double()
    expected = exact.flatten() * pairs.shape[0]
    small = expected < 5
    if expected[small].sum() == 0:  # every small cell impossible (a top-p nucleus): a draw there fails the test
        if observed[small].sum() > 0:
            return 0.0
        observed, expected = observed[~small], expected[~small]
    else:
        observed = torch.cat([observed[~small], observed[small].sum()[None]])
        expected = torch.cat([expected[~small], expected[small].sum()[None]])
    return float(chisquare(observed.numpy(), expected.numpy() * observed.sum().item() / expected.sum().item()).pvalue)
