"""Pinning torch's intra-op thread count for one call, leaving the caller's setting as it was."""

from contextlib import contextmanager

import torch


@contextmanager
def torch_threads(num_threads: int | None):
    """Run the block with `num_threads` torch threads (None: leave the count alone), then restore the count."""
    before = torch.get_num_threads()
    if num_threads is not None:
        if num_threads < 1:
            raise ValueError(f"threads must be >= 1, got {num_threads}")
        torch.set_num_threads(num_threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)
