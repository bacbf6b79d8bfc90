"""Training inputs that teach every draft block of a sequence in one forward (the block-diffusion layout).

The drafter sees a clean copy of the sequence (causal attention) and a noised copy beside it, cut into blocks
of `block_size`. A noised token attends to the clean tokens before its block (what the prefix cache holds at
drafting time) and to the noised tokens of its own block (the draft block). So one forward over 2L tokens gives
the drafter's predictions for all L/block_size blocks, exactly as it would draft each of them.

A conditioned drafter sees the verifier's features of the sequence instead of a clean copy, and each block opens
with its anchor (the clean token before it): the block attends to the features of the tokens before its anchor
and to itself, as at drafting time, where the verifier has not read the anchor yet.
"""

from dataclasses import dataclass

import torch

NOISE_MODES = ("full", "suffix", "random")


@dataclass
class BlockDiffusionBatch:
    input_ids: torch.Tensor  # [batch, 2L]: clean copy, then noised copy
    position_ids: torch.Tensor  # [batch, 2L]
    attention_mask: torch.Tensor  # [1, 1, 2L, 2L] boolean, True = may attend
    targets: torch.Tensor  # [batch, num_blocks, block_size] clean ids of the noised copy, block by block
    masked: torch.Tensor  # [batch, num_blocks, block_size] True where the noised copy holds the mask token
    mask_ratio: torch.Tensor  # [batch, num_blocks, 1] the masking probability each block was noised with
    block_slice: slice  # where the blocks lie in the sequence
    conditioned: bool = False  # input_ids are the anchored blocks [batch, num_blocks * (block_size + 1)] only


def block_attention_pattern(length: int, block_size: int, offset: int, device=None) -> torch.Tensor:
    """Boolean [1, 1, 2L, 2L]: clean tokens causal; a noised token sees the clean tokens before its block and its block."""
    pos = torch.arange(length, device=device)
    block = torch.div(pos - offset, block_size, rounding_mode="floor")
    clean_clean = pos[:, None] >= pos[None, :]
    noisy_clean = block[:, None] > block[None, :]
    noisy_noisy = block[:, None] == block[None, :]
    top = torch.cat([clean_clean, torch.zeros_like(clean_clean)], dim=1)
    bottom = torch.cat([noisy_clean, noisy_noisy], dim=1)
    return torch.cat([top, bottom], dim=0)[None, None]


def conditioned_attention_pattern(length: int, block_size: int, offset: int, num_blocks: int, device=None):
    """Boolean [1, 1, nb*(B+1), L + nb*(B+1)]: block j (anchor at offset + j*B - 1) sees the features of the
    tokens before its anchor and its own B + 1 entries."""
    width = block_size + 1
    block = torch.arange(num_blocks * width, device=device) // width
    anchor = offset + block * block_size - 1
    to_context = torch.arange(length, device=device)[None, :] < anchor[:, None]
    to_blocks = block[:, None] == block[None, :]
    return torch.cat([to_context, to_blocks], dim=1)[None, None]


def make_block_diffusion_batch(
    clean_ids: torch.Tensor,
    block_size: int,
    mask_token_index: int,
    noise: str = "full",
    generator: torch.Generator | None = None,
    conditioned: bool = False,
    part: tuple[int, int] = (0, 1),
) -> BlockDiffusionBatch:
    """Noise `clean_ids` [batch, L] block by block and lay out the clean and noised copies for one forward
    (`conditioned`: the anchored noised blocks alone, for a drafter that reads the verifier's features).

    Noise modes: `"full"` masks whole blocks (drafting in one step, T=1); `"suffix"` masks each block from a random
    cut to its end (the state of left-to-right drafting at any step); `"random"` masks each token of a block with a
    probability drawn uniformly per block (the MDLM forward process). `part=(index, count)`: `clean_ids` are rows
    index, index + count, ... of a global batch, and get the noise those rows get when the whole batch is noised.
    """
    if noise not in NOISE_MODES:
        raise ValueError(f"noise must be one of {NOISE_MODES}, got {noise!r}")
    batch, length = clean_ids.shape
    if length < block_size + 1:
        raise ValueError(f"sequences of {length} tokens are too short for block_size {block_size}")
    device = clean_ids.device
    # Random block boundaries (the first block starts after at least one clean token), so blocks start anywhere.
    offset = int(torch.randint(1, block_size + 1, (1,), generator=generator))
    num_blocks = (length - offset) // block_size
    blocks = slice(offset, offset + num_blocks * block_size)
    targets = clean_ids[:, blocks].reshape(batch, num_blocks, block_size)

    index, count = part
    mine = slice(index, None, count)
    if noise == "suffix":
        cut = torch.randint(0, block_size, (batch * count, num_blocks, 1), generator=generator)[mine].to(device)
        masked = torch.arange(block_size, device=device) >= cut
        ratio = (block_size - cut).float() / block_size
    elif noise == "random":
        ratio = torch.rand(batch * count, num_blocks, 1, generator=generator)[mine].to(device).clamp_min(1e-3)
        masked = torch.rand(batch * count, num_blocks, block_size, generator=generator)[mine].to(device) < ratio
    else:  # full
        ratio = torch.ones(batch, num_blocks, 1, device=device)
        masked = torch.ones_like(targets, dtype=torch.bool)
    noisy = clean_ids.clone()
    noisy[:, blocks] = torch.where(masked, mask_token_index, targets).reshape(batch, -1)
    positions = torch.arange(length, device=device).expand(batch, -1)
    if conditioned:
        anchors = clean_ids[:, offset - 1 : offset - 1 + num_blocks * block_size : block_size]
        noised = noisy[:, blocks].reshape(batch, num_blocks, block_size)
        query = torch.cat([anchors[..., None], noised], dim=-1).reshape(batch, -1)
        anchor_positions = offset - 1 + torch.arange(num_blocks, device=device) * block_size
        query_positions = (anchor_positions[:, None] + torch.arange(block_size + 1, device=device)).flatten()
        return BlockDiffusionBatch(
            input_ids=query,
            position_ids=torch.cat([positions, query_positions.expand(batch, -1)], dim=1),
            attention_mask=conditioned_attention_pattern(length, block_size, offset, num_blocks, device),
            targets=targets,
            masked=masked,
            mask_ratio=ratio,
            block_slice=blocks,
            conditioned=True,
        )
    return BlockDiffusionBatch(
        input_ids=torch.cat([clean_ids, noisy], dim=1),
        position_ids=torch.cat([positions, positions], dim=1),
        attention_mask=block_attention_pattern(length, block_size, offset, device),
        targets=targets,
        masked=masked,
        mask_ratio=ratio,
        block_slice=blocks,
    )


def block_logits(drafter, batch: BlockDiffusionBatch, verifier_features: torch.Tensor | None = None) -> torch.Tensor:
    """The drafter's head logits [batch, num_blocks, block_size, head_size] on the noised blocks (one forward).

    With a reduced draft vocabulary these are over the draft vocabulary: map targets with `drafter.to_draft_vocab`.
    `drafter` may be wrapped (DDP): it is only called. A conditioned batch needs the verifier's features of the
    clean sequence [batch, L, F].
    """
    if batch.conditioned:
        if verifier_features is None:
            raise ValueError("a conditioned batch needs the verifier's features of the clean sequence")
        logits = drafter(input_ids=batch.input_ids, position_ids=batch.position_ids,
                         attention_mask=batch.attention_mask, verifier_features=verifier_features,
                         head_logits=True).logits
        return logits.reshape(*batch.targets.shape[:2], batch.targets.shape[2] + 1, -1)[:, :, 1:]
    length = batch.input_ids.shape[1] // 2
    logits = drafter(input_ids=batch.input_ids, position_ids=batch.position_ids, attention_mask=batch.attention_mask,
                     logits_to_keep=length, head_logits=True).logits
    return logits[:, batch.block_slice].reshape(*batch.targets.shape, -1)
