"""Batched generation for making training data: left-padded prompts decoded together, rows leaving the batch (and
its KV cache) once they have emitted an end-of-sequence token, so a batch costs about what its rows need rather
than what its longest row needs."""

import torch
from transformers import DynamicCache, LogitsProcessorList, TemperatureLogitsWarper, TopPLogitsWarper

# Finished rows are dropped once no more than this share of the batch is still running: each drop copies the whole
# KV cache, so rows are let go in groups (a finished row costs a little compute until then; its tokens are ignored).
COMPACT_AT = 0.75


def _sampling_warpers(temperature: float, top_p: float) -> LogitsProcessorList:
    warpers = LogitsProcessorList()
    if temperature != 1.0:
        warpers.append(TemperatureLogitsWarper(temperature))
    if top_p < 1.0:
        warpers.append(TopPLogitsWarper(top_p))
    return warpers


def _left_pad(prompts: list[list[int]], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    longest = max(map(len, prompts))
    ids = torch.tensor([[pad_id] * (longest - len(p)) + list(p) for p in prompts], device=device)
    mask = torch.tensor([[0] * (longest - len(p)) + [1] * len(p) for p in prompts], device=device)
    return ids, mask


@torch.no_grad()
def generate_batch(model, prompts: list[list[int]], max_new_tokens: int, eos_ids: set[int], pad_id: int,
                   temperature: float = 0.0, top_p: float = 1.0,
                   generator: torch.Generator | None = None) -> list[list[int]]:
    """The responses (token ids, ending with the end-of-sequence id where one was produced) of `model` to `prompts`.

    `temperature` 0 is greedy decoding; otherwise tokens are sampled (with `top_p` nucleus filtering) using
    `generator`, so a batch is reproducible from its seed."""
    if not prompts or min(map(len, prompts)) == 0:
        raise ValueError("generate_batch needs at least one prompt, each of at least one token")
    ids, mask = _left_pad(prompts, pad_id, model.device)
    positions = (mask.cumsum(-1) - 1).clamp_min(0)
    cache = DynamicCache(config=model.config)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache, use_cache=True,
                   logits_to_keep=1).logits[:, -1]
    warpers = _sampling_warpers(temperature, top_p) if temperature > 0 else None
    rows = torch.arange(len(prompts), device=model.device)  # which prompt each batch row answers
    next_position = positions[:, -1] + 1
    responses: list[list[int]] = [[] for _ in prompts]
    finished: set[int] = set()
    alive = torch.ones(len(prompts), dtype=torch.bool, device=model.device)
    for step in range(max_new_tokens):
        if warpers is None:
            tokens = logits.argmax(-1)
        else:
            probs = warpers(ids, logits.float()).softmax(-1)
            tokens = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
        for row, token, running in zip(rows.tolist(), tokens.tolist(), alive.tolist()):
            if running:
                responses[row].append(token)
                if token in eos_ids:
                    finished.add(row)
        alive = torch.tensor([row not in finished for row in rows.tolist()], device=model.device)
        if step == max_new_tokens - 1 or not alive.any():
            break
        if alive.sum() <= COMPACT_AT * len(alive):  # finished rows leave the batch and the cache
            keep = alive.nonzero().flatten()
            cache.batch_select_indices(keep)
            rows, tokens, mask, next_position, alive = (rows[keep], tokens[keep], mask[keep], next_position[keep],
                                                        alive[keep])
        mask = torch.cat([mask, mask.new_ones(mask.shape[0], 1)], dim=1)
        logits = model(input_ids=tokens[:, None], attention_mask=mask, position_ids=next_position[:, None],
                       past_key_values=cache, use_cache=True).logits[:, -1]
        next_position = next_position + 1
    return responses
