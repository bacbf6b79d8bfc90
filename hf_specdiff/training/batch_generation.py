"""Batched generation for making training data: left-padded prompts decoded together, rows leaving the batch (and
its KV cache) once they have emitted an end-of-sequence token, so a batch costs about what its rows need rather
than what its longest row needs. The KV cache is allocated once for the whole generation and written in place."""

from typing import NamedTuple

import torch
from transformers import DynamicCache, TopPLogitsWarper
from transformers.cache_utils import DynamicLayer

from ..decoding import CACHE_KWARG
from ..generation_specdiff import sample_rows, top_p_candidates

# Finished rows are dropped once no more than this share of the batch is still running: each drop copies the whole
# KV cache, so rows are let go in groups (a finished row costs a little compute until then; its tokens are ignored).
COMPACT_AT = 0.75


class PreallocatedLayer(DynamicLayer):
    """A `DynamicLayer` whose keys and values are views of buffers of `capacity` positions, allocated at the first
    update: a step writes its new entries in place. transformers' `DynamicLayer` concatenates, copying the whole
    cache every step; at batch 128 and ~350 positions that copy cost more than the model's matrix products here."""

    def __init__(self, capacity: int):
        super().__init__()
        self.capacity = capacity
        self.length = 0

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        self._keys = key_states.new_empty(*key_states.shape[:2], self.capacity, key_states.shape[-1])
        self._values = value_states.new_empty(*value_states.shape[:2], self.capacity, value_states.shape[-1])
        self.length = 0
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self.length + key_states.shape[-2]
        if end > self.capacity:
            raise ValueError(f"PreallocatedLayer holds {self.capacity} positions; {end} were written")
        self._keys[:, :, self.length:end] = key_states
        self._values[:, :, self.length:end] = value_states
        self.length = end
        self.keys, self.values = self._keys[:, :, :end], self._values[:, :, :end]
        return self.keys, self.values

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self.is_initialized:
            self._keys = self._keys.repeat_interleave(repeats, 0)
            self._values = self._values.repeat_interleave(repeats, 0)
            self.keys, self.values = self._keys[:, :, :self.length], self._values[:, :, :self.length]

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self.is_initialized:
            self._keys, self._values = self._keys[indices], self._values[indices]
            self.keys, self.values = self._keys[:, :, :self.length], self._values[:, :, :self.length]


def preallocated_cache(model, capacity: int) -> DynamicCache:
    """A `DynamicCache` for `model` whose full-attention layers are `PreallocatedLayer`s of `capacity` positions
    (sliding-window layers keep transformers' own, which stay short)."""
    cache = DynamicCache(config=model.config)
    cache.layers = [PreallocatedLayer(capacity) if type(layer) is DynamicLayer else layer for layer in cache.layers]
    return cache


def sample_tokens(logits: torch.Tensor, temperature: float, top_p: float = 1.0,
                  generator: torch.Generator | None = None, candidates: int = 1024) -> torch.Tensor:
    """One token per row of `logits` [rows, vocab], drawn from softmax(logits / temperature) restricted to its top-p
    nucleus (the most probable tokens whose probabilities, those ranked above each, sum to less than `top_p`): the
    distribution of transformers' temperature and `TopPLogitsWarper` with `torch.multinomial`, at a fraction of
    the cost for a large batch. The nucleus is looked for among the `candidates` most probable tokens (the whole
    vocabulary for a row whose candidates hold less than `top_p`), and tokens are drawn by inverting the cumulative
    distribution: sorting and `multinomial` over 128 x 49k logits each cost about as much as the model's forward."""
    probs = (logits.float() / temperature).softmax(-1)
    if top_p >= 1.0:
        return sample_rows(probs, 1, generator)[:, 0]
    top, ids, keep = top_p_candidates(probs, top_p, candidates)
    tokens = ids.gather(-1, sample_rows(top * keep, 1, generator)).squeeze(-1)
    wide = keep[:, -1]  # rows whose nucleus may reach past their candidates
    if wide.any():
        nucleus = TopPLogitsWarper(top_p)(None, probs[wide].log()).softmax(-1)
        tokens[wide] = sample_rows(nucleus, 1, generator)[:, 0]
    return tokens


def _left_pad(prompts: list[list[int]], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    longest = max(map(len, prompts))
    ids = torch.tensor([[pad_id] * (longest - len(p)) + list(p) for p in prompts], device=device)
    mask = torch.tensor([[0] * (longest - len(p)) + [1] * len(p) for p in prompts], device=device)
    return ids, mask


class BatchGeneration(NamedTuple):
    """`generate_batch`'s responses, and the hidden states it read along them when asked for some."""

    responses: list[list[int]]
    hidden_states: list[torch.Tensor] | None = None  # per prompt: [len(prompt) + len(response), F] in bf16


@torch.no_grad()
def generate_batch(model, prompts: list[list[int]], max_new_tokens: int, eos_ids: set[int], pad_id: int,
                   temperature: float = 0.0, top_p: float = 1.0, generator: torch.Generator | None = None,
                   output_hidden_states: list[int] | None = None) -> BatchGeneration:
    """The responses (token ids, ending with the end-of-sequence id where one was produced) of `model` to `prompts`.

    `temperature` 0 is greedy decoding; otherwise tokens are sampled (with `top_p` nucleus filtering) using
    `generator`, so a batch is reproducible from its seed. `output_hidden_states` (indices, as transformers' argument
    of that name selects them) also returns those hidden states, concatenated, at every prompt and response token:
    what a teacher-forced forward over prompt + response would give, read along the way (each response's last
    token costs one more step)."""
    if not prompts or min(map(len, prompts)) == 0:
        raise ValueError("generate_batch needs at least one prompt, each of at least one token")
    ids, mask = _left_pad(prompts, pad_id, model.device)
    positions = (mask.cumsum(-1) - 1).clamp_min(0)
    cache = preallocated_cache(model, ids.shape[1] + max_new_tokens)
    same = all(prompt == prompts[0] for prompt in prompts)  # (Magpie) identical prompts: read one, copy its cache
    read = slice(0, 1) if same else slice(None)
    out = model(input_ids=ids[read], attention_mask=mask[read], position_ids=positions[read], **{CACHE_KWARG: cache},
                use_cache=True, logits_to_keep=1, output_hidden_states=output_hidden_states)
    logits = out.logits[:, -1]
    if same:
        cache.batch_repeat_interleave(len(prompts))
        logits = logits.expand(len(prompts), -1)
    if output_hidden_states:
        states = _selected(out, output_hidden_states)
        read_states = [[states[0 if same else b, ids.shape[1] - len(p):]] for b, p in enumerate(prompts)]
    rows = torch.arange(len(prompts), device=model.device)  # which prompt each batch row answers
    next_position = positions[:, -1] + 1
    responses: list[list[int]] = [[] for _ in prompts]
    finished: set[int] = set()
    alive = torch.ones(len(prompts), dtype=torch.bool, device=model.device)
    for step in range(max_new_tokens):
        tokens = logits.argmax(-1) if temperature == 0 else sample_tokens(logits, temperature, top_p, generator)
        wrote = alive  # rows that take this step's token
        for row, token, running in zip(rows.tolist(), tokens.tolist(), alive.tolist()):
            if running:
                responses[row].append(token)
                if token in eos_ids:
                    finished.add(row)
        alive = torch.tensor([row not in finished for row in rows.tolist()], device=model.device)
        last = step == max_new_tokens - 1 or not alive.any()
        if last and not output_hidden_states:
            break
        reading = alive | wrote if output_hidden_states else alive  # rows whose new token is read
        if reading.sum() <= COMPACT_AT * len(reading):  # the other rows leave the batch and the cache
            keep = reading.nonzero().flatten()
            cache.batch_select_indices(keep)
            rows, tokens, mask, next_position, alive, wrote = (rows[keep], tokens[keep], mask[keep],
                                                               next_position[keep], alive[keep], wrote[keep])
        mask = torch.cat([mask, mask.new_ones(mask.shape[0], 1)], dim=1)
        out = model(input_ids=tokens[:, None], attention_mask=mask, position_ids=next_position[:, None],
                    **{CACHE_KWARG: cache}, use_cache=True, output_hidden_states=output_hidden_states)
        if output_hidden_states:
            states = _selected(out, output_hidden_states)
            for row, state, took in zip(rows.tolist(), states, wrote.tolist()):
                if took:
                    read_states[row].append(state)
        if last:
            break
        logits = out.logits[:, -1]
        next_position = next_position + 1
    if not output_hidden_states:
        return BatchGeneration(responses)
    return BatchGeneration(responses, [torch.cat(parts) for parts in read_states])


def _selected(out, indices: list[int]) -> torch.Tensor:
    """The hidden states at `indices` of a model output, concatenated [batch, seq, F], in bf16 on the CPU."""
    return torch.cat([out.hidden_states[i] for i in indices], dim=-1).to("cpu", torch.bfloat16)
