"""Drafting with a SpecDiff drafter: the prefix cache, the unmasking schedule and the denoising sampler.

One drafting round encodes the tokens the verifier committed since the last round (causal attention, their
keys and values appended to the cache) together with a block of mask tokens (bidirectional attention inside
the block), then fills the block in T denoising steps. Step 1 is one forward over the new tokens plus the
block; steps 2..T are one forward over the block alone. Nothing is recomputed over the cached prefix.

A conditioned drafter (`config.verifier_layer_ids`) encodes no prefix tokens: its cache holds keys and values of
the verifier's hidden states at the committed tokens (`VerifierFeatures`, filled from the verifier's outputs or by
`VerifierHooks`), and its block is the last committed token (which the verifier has not read yet) plus the masks.

Lossless sampling rules. Speculative sampling accepts draft token i with probability min(1, p_i/q_i), which is
exact when token i was drawn from q_i and q_i depends only on the prefix and on draft tokens < i. So:
- `scores[i]` are the processed logits of the step at which token i was drawn, and token i was drawn from them;
- a step may only look at positions that are already unmasked (all < i under left-to-right chunks) and at mask
  tokens, which are constants;
- which positions a step unmasks must not depend on sampled values. Left-to-right chunks satisfy this;
  confidence-ordered unmasking does not, so it is used for greedy drafting only.

This file ships to the Hub as remote code: it imports only torch and transformers.
"""

import torch

from transformers import LogitsProcessorList, TopPLogitsWarper

from .policies_specdiff import AssistantRounds


class SpecDiffCache:
    """Keys and values of the drafter's committed prefix, with the cache interface transformers' assisted loop uses.

    `get_seq_length()` and `crop(-n)` are what `AssistedCandidateGenerator` calls between rounds. The cache also
    keeps the token ids it encoded, so a round re-encodes only from the first token that differs. When the
    context outgrows the drafter's window (`SpecDiffConfig.drafting_window`), the cache restarts from a recent
    window (`offset` is the absolute index of its first token).
    """

    def __init__(self):
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.token_ids: torch.Tensor | None = None  # [n] ids of the cached tokens
        self.offset = 0
        self.tokens_encoded = 0  # prefix tokens encoded over the cache's life: the drafting cost beyond the blocks
        self.verifier_features = VerifierFeatures()  # what a conditioned drafter reads (unused by a standalone one)
        self.assistant_rounds: AssistantRounds | None = None  # set when transformers' assisted loop calls the drafter
        self.verifier_kernels = None  # with it: the profile's kernels for each verification forward (`VerifierKernels`)

    @property
    def num_cached(self) -> int:
        return 0 if self.token_ids is None else self.token_ids.shape[0]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.offset + self.num_cached

    def crop(self, tokens_to_remove: int):
        """Remove `-tokens_to_remove` tokens from the end (transformers' convention: 0 is a no-op)."""
        if tokens_to_remove > 0:
            raise ValueError(f"crop takes a negative count of tokens to remove, got {tokens_to_remove}")
        self.truncate(self.get_seq_length() + tokens_to_remove)

    def truncate(self, length: int):
        """Keep the first `length` tokens (absolute positions)."""
        keep_cached = length - self.offset
        if keep_cached <= 0:
            self.reset()
        elif keep_cached < self.num_cached:
            self.token_ids = self.token_ids[:keep_cached]
            self.keys = [k[:, :, :keep_cached] for k in self.keys]
            self.values = [v[:, :, :keep_cached] for v in self.values]

    def reset(self, offset: int = 0):
        self.keys, self.values, self.token_ids, self.offset = [], [], None, offset

    def layer(self, idx: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        return (self.keys[idx], self.values[idx]) if idx < len(self.keys) else None

    def append(self, idx: int, key: torch.Tensor, value: torch.Tensor):
        if idx < len(self.keys):
            self.keys[idx] = torch.cat([self.keys[idx], key], dim=2)
            self.values[idx] = torch.cat([self.values[idx], value], dim=2)
        else:
            self.keys.append(key)
            self.values.append(value)

    def sync(self, input_ids: torch.Tensor, window: int, block_size: int) -> torch.Tensor:
        """Align the cache with `input_ids` ([seq]) and return the ids still to encode.

        Drops cached tokens that disagree with `input_ids`, and restarts from the last `window` tokens when the
        prefix plus a block would pass the position limit `window + block_size`.
        """
        length = input_ids.shape[0]
        if self.num_cached:
            cached = input_ids[self.offset : self.offset + self.num_cached]
            same = (cached == self.token_ids[: cached.shape[0]]).long().cumprod(0).sum().item()
            self.truncate(self.offset + same)
        if length - self.offset + block_size > window + block_size:
            self.reset(offset=max(0, length - window // 2))
        new_ids = input_ids[self.get_seq_length() :]
        self.token_ids = new_ids if self.token_ids is None else torch.cat([self.token_ids, new_ids])
        self.tokens_encoded += new_ids.shape[0]
        return new_ids


class VerifierFeatures:
    """The verifier's hidden states at the layers a conditioned drafter reads, one row per token it has read.

    `record(start, token_ids, features)` stores one verifier forward's inputs from absolute position `start`,
    dropping what was recorded from there on (rejected draft tokens, or another sequence). A verifier is causal, so
    the rows are valid for any sequence that starts with `token_ids`: `usable_length` is that common prefix.
    """

    def __init__(self):
        self._ids: torch.Tensor | None = None  # buffers that grow by doubling: a round writes only its new rows
        self._features: torch.Tensor | None = None
        self.length = 0

    @property
    def token_ids(self) -> torch.Tensor | None:
        """[n] the token ids the verifier read."""
        return None if self._ids is None else self._ids[: self.length]

    @property
    def features(self) -> torch.Tensor | None:
        """[n, num_layers * verifier_hidden_size] the verifier's features at those tokens."""
        return None if self._features is None else self._features[: self.length]

    def __len__(self) -> int:
        return self.length

    def reset(self):
        self._ids = self._features = None
        self.length = 0

    def record(self, start: int, token_ids: torch.Tensor, features: torch.Tensor):
        if start > self.length:  # positions before `start` are unknown: keep nothing
            self.reset()
            return
        end = start + token_ids.shape[0]
        if self._ids is None or end > self._ids.shape[0]:
            capacity = max(end, 2 * (0 if self._ids is None else self._ids.shape[0]))
            ids = token_ids.new_empty(capacity)
            rows = features.new_empty(capacity, features.shape[-1])
            if start:
                ids[:start], rows[:start] = self._ids[:start], self._features[:start]
            self._ids, self._features = ids, rows
        self._ids[start:end] = token_ids.to(self._ids.device)
        self._features[start:end] = features.detach().to(self._features)
        self.length = end

    def usable_length(self, input_ids: torch.Tensor) -> int:
        """How many leading tokens of `input_ids` ([seq]) have recorded features."""
        length = min(len(self), input_ids.shape[0])
        if not length:
            return 0
        same = self.token_ids[:length] == input_ids[:length].to(self.token_ids.device)
        return int(same.long().cumprod(0).sum())


def decoder_layers(model) -> torch.nn.ModuleList:
    """The verifier's decoder layers: its first module list with one entry per hidden layer."""
    num_layers = model.config.get_text_config().num_hidden_layers
    for module in model.modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) == num_layers:
            return module
    raise ValueError(f"cannot find the {num_layers} decoder layers of {type(model).__name__}")


class VerifierHooks:
    """Forward hooks that record, after each single-sequence verifier forward, the outputs of `layer_ids` into
    `features` (positions from the verifier cache's length before the call). They change no output; `remove()`
    takes them off. Batched or `inputs_embeds` forwards clear the store instead (a drafter drafts for one sequence).
    """

    def __init__(self, verifier, layer_ids: list[int], features: VerifierFeatures):
        self.features = features
        self.layer_ids = list(layer_ids)
        self._outputs: dict[int, torch.Tensor] = {}
        self._call: tuple[int, torch.Tensor | None] | None = None
        layers = decoder_layers(verifier)
        self.handles = [verifier.register_forward_pre_hook(self._before, with_kwargs=True),
                        verifier.register_forward_hook(self._after)]
        self.handles += [layers[i].register_forward_hook(self._capture(i)) for i in self.layer_ids]

    def _before(self, module, args, kwargs):
        input_ids = kwargs.get("input_ids", args[0] if args else None)
        cache = kwargs.get("cache", kwargs.get("past_key_values"))  # "cache" from transformers 5.24 on
        start = cache.get_seq_length() if cache is not None and hasattr(cache, "get_seq_length") else 0
        self._call = (start, input_ids)
        self._outputs.clear()

    def _capture(self, index: int):
        def hook(module, args, output):
            self._outputs[index] = (output[0] if isinstance(output, tuple) else output).detach()
        return hook

    def _after(self, module, args, output):
        start, input_ids = self._call or (0, None)
        if input_ids is None or input_ids.shape[0] != 1 or len(self._outputs) != len(self.layer_ids):
            self.features.reset()
        else:
            features = torch.cat([self._outputs[i][0] for i in self.layer_ids], dim=-1)
            self.features.record(start, input_ids[0], features)
        self._outputs.clear()
        self._call = None

    def remove(self):
        for handle in self.handles:
            handle.remove()
        self.handles = []


def point_mass_scores(draft: torch.Tensor, vocab_size: int) -> tuple[torch.Tensor, ...]:
    """The scores of a draft [1, g] that was not drawn from a distribution (prompt lookup's), one [1, vocab_size]
    per token: 0 at the token, -inf elsewhere. As a point mass q, speculative sampling accepts the token with its
    probability under the verifier and, on rejection, removes it from the target: lossless."""
    scores = torch.full((draft.shape[1], vocab_size), float("-inf"), device=draft.device)
    return tuple(scores.scatter_(1, draft.T, 0.0)[:, None].unbind(0))


def unmasking_chunks(num_tokens: int, num_steps: int) -> list[int]:
    """How many positions each denoising step unmasks: `num_tokens` split into at most `num_steps` near-equal chunks."""
    steps = min(num_steps, num_tokens)
    return [num_tokens // steps + (1 if i < num_tokens % steps else 0) for i in range(steps)]


def block_attention_mask(num_new: int, num_cached: int, block_len: int, device) -> torch.Tensor:
    """Boolean mask [1, 1, num_new + block_len, num_cached + num_new + block_len] for one drafting forward.

    New prefix tokens attend causally (to the cache and to earlier new tokens); block tokens attend to the whole
    prefix and to each other.
    """
    q = num_new + block_len
    k = num_cached + q
    mask = torch.ones(q, k, dtype=torch.bool, device=device)
    if num_new:
        mask[:num_new, num_cached:] = torch.ones(num_new, q, dtype=torch.bool, device=device).tril(0)
    return mask[None, None]


def top_p_candidates(probs: torch.Tensor, top_p: float, candidates: int = 1024):
    """The `candidates` most probable tokens of each row of `probs` [rows, vocab] (their probabilities and ids,
    [rows, candidates]) and which of them are in the row's top-p nucleus (the probability ranked above a token is
    under `top_p`). Where a row's last candidate is kept, its nucleus may reach past its candidates."""
    top, ids = probs.topk(min(candidates, probs.shape[-1]), dim=-1)
    return top, ids, top.cumsum(-1) - top < top_p


class CandidateTopPLogitsWarper(TopPLogitsWarper):
    """transformers' `TopPLogitsWarper` for draft positions: the same nucleus (up to rounding at its edge), found among
    the `candidates` most probable tokens instead of by sorting the whole vocabulary, which cost more than a small
    drafter's forward (the whole vocabulary only for a row whose candidates hold less than `top_p`). Lossless: a draft
    token may come from any distribution, as long as its scores are the ones it was drawn from."""

    candidates = 1024

    def __call__(self, input_ids: torch.LongTensor, scores: torch.Tensor) -> torch.Tensor:
        _, ids, keep = top_p_candidates(scores.float().softmax(-1), self.top_p, self.candidates)
        keep[:, :self.min_tokens_to_keep] = True
        kept = torch.where(keep, scores.gather(-1, ids), self.filter_value)
        processed = torch.full_like(scores, self.filter_value).scatter_(-1, ids, kept)
        wide = keep[:, -1]  # rows whose nucleus may reach past their candidates
        if wide.any():
            processed[wide] = super().__call__(input_ids, scores[wide])
        return processed


def draft_processors(logits_processor: LogitsProcessorList) -> LogitsProcessorList:
    """`logits_processor` with its top-p warpers computed among candidates (`CandidateTopPLogitsWarper`)."""
    return LogitsProcessorList(
        CandidateTopPLogitsWarper(p.top_p, p.filter_value, p.min_tokens_to_keep) if type(p) is TopPLogitsWarper else p
        for p in logits_processor)


def select_tokens(scores: torch.Tensor, do_sample: bool, generator: torch.Generator | None = None) -> torch.Tensor:
    """Draw one token per row of processed logits `scores` [n, vocab]: argmax, or a sample of softmax(scores)."""
    if not do_sample:
        return scores.argmax(-1)
    return sample_rows(scores.float().softmax(-1), 1, generator)[:, 0]


def sample_rows(weights: torch.Tensor, num_samples: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """`num_samples` independent draws [rows, num_samples] per row of non-negative `weights` [rows, n], each index
    with probability proportional to its weight: by inverting the cumulative distribution (`torch.multinomial` cost
    about 1 ms a row of 49k here, this 0.04 ms)."""
    cdf = weights.double().cumsum(-1)
    u = torch.rand(weights.shape[0], num_samples, generator=generator, dtype=torch.float64, device=weights.device)
    return torch.searchsorted(cdf, u * cdf[:, -1:], right=True).clamp_max(weights.shape[-1] - 1)


@torch.no_grad()
def draft_block(
    drafter,
    input_ids: torch.Tensor,
    cache: SpecDiffCache,
    num_tokens: int,
    logits_processor: LogitsProcessorList,
    do_sample: bool,
    num_steps: int,
    schedule: str = "left_to_right",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Denoise the first `num_tokens` positions of a block of mask tokens after `input_ids` ([1, seq]).

    The block is as long as the drafter was trained on (`max_draft_tokens`) however few tokens are drafted: attention is
    bidirectional inside it, so a shorter block would change what every position sees. Returns the draft
    [1, num_tokens] and, for each draft token, the processed logits it was drawn from [num_tokens, vocab] (float32).
    """
    config = drafter.config
    device = input_ids.device
    logits_processor = draft_processors(logits_processor)
    block_len = max(num_tokens, config.max_draft_tokens)
    step_forward = (_conditioned_forward if config.is_conditioned else _standalone_forward)(
        drafter, input_ids, cache, num_tokens, block_len)
    block = torch.full((1, block_len), config.mask_token_index, dtype=torch.long, device=device)
    decided = torch.zeros(num_tokens, dtype=torch.bool, device=device)
    scores = torch.empty(num_tokens, config.vocab_size, dtype=torch.float32, device=device)
    if do_sample and schedule == "confidence":
        schedule = "left_to_right"  # confidence order depends on sampled values: biased for sampling

    first = 0  # left to right: the chunk's first position, known without asking the device
    for step, chunk in enumerate(unmasking_chunks(num_tokens, num_steps)):
        logits = step_forward(block, step == 0)
        if schedule == "confidence":
            confidence = logits.max(-1).values.masked_fill(decided, float("-inf"))
            positions_now = confidence.topk(chunk).indices.sort().values
            decided_left = int(decided.long().cumprod(0).sum())  # a host sync: the order depends on the logits
        else:
            positions_now = torch.arange(first, first + chunk, device=device)
            decided_left, first = first, first + chunk
        context_len = input_ids.shape[1] + decided_left  # ids decided left of the chunk
        context = torch.cat([input_ids, block], dim=1)[:, :context_len].expand(chunk, -1)
        step_scores = logits_processor(context, logits[positions_now])
        block[0, positions_now] = select_tokens(step_scores, do_sample)
        scores[positions_now] = step_scores
        decided[positions_now] = True
    return block[:, :num_tokens], scores


def _standalone_forward(drafter, input_ids, cache, num_tokens, block_len):
    """One denoising forward of a standalone drafter over a block of `block_len` tokens, returning the logits of its
    first `num_tokens`: the first step also encodes the uncached prefix tokens."""
    config = drafter.config
    device = input_ids.device
    new_ids = cache.sync(input_ids[0], config.drafting_window - block_len, block_len)
    start = cache.get_seq_length() - cache.offset  # position of the first block token, relative to the window
    block_positions = torch.arange(start, start + block_len, device=device)

    def forward(block, first):
        num_new = new_ids.shape[0] if first else 0
        query = torch.cat([new_ids[None], block], dim=1) if num_new else block
        positions = torch.cat([torch.arange(start - num_new, start, device=device), block_positions])
        return drafter(
            input_ids=query,
            position_ids=positions[None],
            attention_mask=block_attention_mask(num_new, start - num_new, block_len, device),
            past_key_values=cache,
            num_prefix_tokens=num_new,
            logits_to_keep=slice(num_new, num_new + num_tokens),
        ).logits[0].float()

    return forward


def _conditioned_forward(drafter, input_ids, cache, num_tokens, block_len):
    """One denoising forward of a conditioned drafter over a block of `block_len` tokens, returning the logits of its
    first `num_tokens`.

    The context is the verifier's features at the committed tokens it has read, except the last token (the anchor,
    which opens the block); the first step caches the context rows not cached yet. Tokens without features (only
    on a first round, before the verifier has read the prompt) join the anchor, at most `block_len` of them.
    """
    config = drafter.config
    device = input_ids.device
    store = cache.verifier_features
    length = input_ids.shape[1]
    read = min(store.usable_length(input_ids[0]), length - 1)
    new_ids = cache.sync(input_ids[0, :read], config.drafting_window - block_len - 1, block_len)
    num_new = new_ids.shape[0]
    width = len(config.verifier_layer_ids) * config.verifier_hidden_size
    features = store.features[read - num_new : read] if num_new else torch.zeros(0, width)
    features = features.to(device)[None]
    first_anchor = max(read, length - block_len)
    anchors = input_ids[:, first_anchor:]
    context_positions = torch.arange(read - num_new, read, device=device) - cache.offset
    query_positions = torch.arange(first_anchor, length + block_len, device=device) - cache.offset
    keep = slice(anchors.shape[1], anchors.shape[1] + num_tokens)

    def forward(block, first):
        positions = torch.cat([context_positions, query_positions]) if first and num_new else query_positions
        return drafter(
            input_ids=torch.cat([anchors, block], dim=1),
            verifier_features=features if first else features[:, :0],
            position_ids=positions[None],
            past_key_values=cache,
            logits_to_keep=keep,
        ).logits[0].float()

    return forward


__all__ = ["SpecDiffCache", "VerifierFeatures", "VerifierHooks", "decoder_layers", "point_mass_scores",
           "unmasking_chunks", "block_attention_mask", "select_tokens", "draft_block"]
