"""Configuration of the SpecDiff drafter: a masked (absorbing-state) block-diffusion language model.

This file ships to the Hub as remote code: it imports only transformers.
"""

from transformers import PreTrainedConfig

UNMASKING_SCHEDULES = ("left_to_right", "confidence")
LAYOUTS = ("specdiff", "dflash")


class SpecDiffConfig(PreTrainedConfig):
    r"""
    Configuration of [`SpecDiffDrafter`], a masked discrete-diffusion drafter for speculative decoding.

    The drafter reads the verifier's token ids (causal attention over the committed prefix, cached across
    drafting rounds) and denoises a block of `block_size` mask tokens (bidirectional attention inside the
    block) in `num_denoising_steps` forward passes.

    Args:
        vocab_size (`int`): The verifier's vocabulary size, *padded* size included (the width of its logits).
            The drafter's embedding has one more row, the mask token.
        hidden_size, intermediate_size, num_hidden_layers, num_attention_heads, num_key_value_heads, head_dim:
            Transformer body sizes (Llama-style: RMSNorm, RoPE, SwiGLU, grouped-query attention).
        max_position_embeddings (`int`): Longest window (prefix + block) the drafter may attend to (what an export
            declares). Longer contexts are drafted from their most recent tokens.
        context_window (`int`, *optional*): The window (prefix + block) the drafter attends to when drafting: the one
            it was trained on (the trainer writes `seq_len + block_size + 1`), since a drafter trained on short
            windows drafts worse from far positions. Longer contexts restart from their most recent tokens. `None`:
            `max_position_embeddings`.
        block_size (`int`): The longest draft the drafter proposes in one round (the draft block).
        num_denoising_steps (`int`): Forward passes per draft (T). 1 drafts the whole block at once.
        unmasking_schedule (`str`): `"left_to_right"` unmasks contiguous chunks from left to right, one chunk per
            step; it is lossless for sampling. `"confidence"` unmasks the most confident positions first; its
            order depends on sampled values, so it is used for greedy drafting only (sampling falls back to
            `"left_to_right"`).
        bos_token_id, eos_token_id, pad_token_id: The verifier's special tokens (assisted generation and
            pipelines require them to match).
        mask_token_index (`int`, *optional*): Embedding row of the mask (absorbing) token; defaults to `vocab_size`,
            the row after the verifier's vocabulary (the drafter never predicts it).
        draft_token_ids (`list[int]`, *optional*): A reduced draft vocabulary: the verifier token ids the head
            predicts. The drafter gives probability 0 to every other token, which keeps decoding lossless and makes the
            head (hidden x vocabulary) much cheaper. `None` predicts the whole vocabulary.
        verifier_name_or_path (`str`, *optional*): The verifier this drafter was trained for.
        verifier_layer_ids (`list[int]`, *optional*): Makes this a *conditioned* drafter: it reads the outputs of
            these verifier decoder layers (0-based; the last layer is excluded, since transformers returns it after
            the final norm) instead of re-encoding the prefix from tokens. Their concatenation is fused by one
            projection into a context vector per committed token; in every drafter layer, the block attends to the
            keys and values of those context vectors (cached across rounds) and to itself. The block is the last
            committed token (not yet read by the verifier) followed by the mask tokens. `None`: a standalone drafter.
        verifier_hidden_size (`int`, *optional*): The verifier's hidden size (required with `verifier_layer_ids`).
        verifier_num_layers (`int`, *optional*): The verifier's number of decoder layers (recorded for exports).
        layout (`str`): `"specdiff"` (the drafter owns its embeddings, with a mask row, and its head) or `"dflash"`,
            the layout of DFlash drafters (z-lab; transformers' `speculation_type="dflash"`, vLLM, SGLang): a
            conditioned drafter at the verifier's width with QK-norm that owns **no** embeddings or head. Its block
            is embedded with the verifier's embedding table (the mask is `mask_token_id`, a verifier token) and its
            logits come from the verifier's head, so it drafts only once given the verifier (`attach`,
            `hf_specdiff.generate`, or transformers' own DFlash loop, which calls `forward(noise_embeds=...)`).
        target_layer_ids (`list[int]`, *optional*): transformers' name for `verifier_layer_ids` (either may be given).
        mask_token_id (`int`, *optional*): `"dflash"` layout: the verifier token whose embedding marks a masked
            position (an id of the verifier's embedding table that text does not use, such as a reserved token).
        qk_norm (`bool`, *optional*): RMSNorm of queries and keys per head before RoPE (Qwen3-style). Defaults to
            True for the `"dflash"` layout (the engines require it) and False otherwise.

    `block_size` is the longest draft, except in the dflash layout, which counts the anchor token in its block (as
    transformers' DFlash loop and the engines do): it drafts at most `block_size - 1` tokens (`max_draft_tokens`).
    """

    model_type = "specdiff"

    def __init__(
        self,
        vocab_size: int = 32000,
        hidden_size: int = 256,
        intermediate_size: int = 768,
        num_hidden_layers: int = 2,
        num_attention_heads: int = 4,
        num_key_value_heads: int | None = None,
        head_dim: int | None = None,
        rms_norm_eps: float = 1e-6,
        rope_theta: float = 10000.0,
        max_position_embeddings: int = 2048,
        context_window: int | None = None,
        initializer_range: float = 0.02,
        block_size: int = 16,
        num_denoising_steps: int = 1,
        unmasking_schedule: str = "left_to_right",
        bos_token_id: int | None = None,
        eos_token_id: int | list[int] | None = None,
        pad_token_id: int | None = None,
        mask_token_index: int | None = None,
        draft_token_ids: list[int] | None = None,
        verifier_name_or_path: str | None = None,
        verifier_layer_ids: list[int] | None = None,
        verifier_hidden_size: int | None = None,
        verifier_num_layers: int | None = None,
        layout: str = "specdiff",
        target_layer_ids: list[int] | None = None,
        mask_token_id: int | None = None,
        qk_norm: bool | None = None,
        **kwargs,
    ):
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
        if unmasking_schedule not in UNMASKING_SCHEDULES:
            raise ValueError(f"unmasking_schedule must be one of {UNMASKING_SCHEDULES}, got {unmasking_schedule!r}")
        _check_sizes(hidden_size, num_attention_heads, head_dim, block_size, num_denoising_steps,
                     max_position_embeddings, context_window)
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads or num_attention_heads
        self.head_dim = head_dim or hidden_size // num_attention_heads
        self.rms_norm_eps = rms_norm_eps
        self.rope_theta = rope_theta
        self.max_position_embeddings = max_position_embeddings
        self.context_window = context_window
        self.initializer_range = initializer_range
        self.block_size = block_size
        self.num_denoising_steps = num_denoising_steps
        self.unmasking_schedule = unmasking_schedule
        self.bos_token_id = bos_token_id
        self.eos_token_id = eos_token_id
        self.pad_token_id = pad_token_id
        self.mask_token_index = vocab_size if mask_token_index is None else mask_token_index
        # The embedding has a mask row the head must not predict, so input and output embeddings stay untied.
        kwargs.pop("tie_word_embeddings", None)
        self.tie_word_embeddings = False
        self.draft_token_ids = _draft_token_ids(draft_token_ids, vocab_size)
        self.verifier_name_or_path = verifier_name_or_path
        self.verifier_layer_ids = _verifier_layer_ids(verifier_layer_ids, target_layer_ids, verifier_hidden_size)
        self.verifier_hidden_size = verifier_hidden_size
        self.verifier_num_layers = verifier_num_layers
        self.layout = layout
        self.qk_norm = layout == "dflash" if qk_norm is None else bool(qk_norm)
        if layout == "dflash":
            _check_dflash_layout(self, mask_token_id)
            self.mask_token_index = mask_token_id
        self.mask_token_id = mask_token_id
        self.target_layer_ids = self.verifier_layer_ids  # what transformers' DFlash loop reads
        super().__init__(**kwargs)

    @property
    def is_conditioned(self) -> bool:
        """Whether the drafter reads the verifier's hidden states (`verifier_layer_ids` is set)."""
        return self.verifier_layer_ids is not None

    @property
    def drafting_window(self) -> int:
        """The window (prefix + block) the drafter attends to when drafting: `context_window`, or
        `max_position_embeddings` when unset."""
        return self.context_window or self.max_position_embeddings

    @property
    def max_draft_tokens(self) -> int:
        """The longest draft: `block_size`, less the anchor token the dflash layout counts in its block (as
        transformers' DFlash loop does)."""
        return self.block_size - 1 if self.layout == "dflash" else self.block_size

    @property
    def uses_verifier_weights(self) -> bool:
        """Whether the drafter embeds and predicts with the verifier's embedding table and head (`"dflash"`)."""
        return self.layout == "dflash"

    @classmethod
    def from_dict(cls, config_dict, **kwargs):
        model_type = config_dict.get("model_type")
        if model_type not in (None, cls.model_type):
            raise ValueError(
                f"This checkpoint is a '{model_type}' model, not a SpecDiff drafter ('{cls.model_type}'). Load it with "
                "AutoModelForCausalLM, and pass a SpecDiff drafter checkpoint as the assistant."
            )
        return super().from_dict(config_dict, **kwargs)


def _check_sizes(hidden_size, num_attention_heads, head_dim, block_size, num_denoising_steps, max_position_embeddings,
                 context_window):
    if block_size < 1 or num_denoising_steps < 1:
        raise ValueError("block_size and num_denoising_steps must be >= 1")
    if hidden_size % num_attention_heads and head_dim is None:
        raise ValueError("hidden_size must be divisible by num_attention_heads, or set head_dim")
    if block_size >= max_position_embeddings:
        raise ValueError(f"block_size ({block_size}) must be smaller than max_position_embeddings "
                         f"({max_position_embeddings})")
    if context_window is not None and not block_size + 1 < context_window <= max_position_embeddings:
        raise ValueError(f"context_window ({context_window}) must be larger than block_size + 1 ({block_size + 1}) "
                         f"and at most max_position_embeddings ({max_position_embeddings})")


def _draft_token_ids(draft_token_ids, vocab_size: int) -> list[int] | None:
    if draft_token_ids is None:
        return None
    draft_token_ids = [int(i) for i in draft_token_ids]
    if len(set(draft_token_ids)) != len(draft_token_ids) or not all(0 <= i < vocab_size for i in draft_token_ids):
        raise ValueError("draft_token_ids must be distinct token ids below vocab_size")
    return draft_token_ids


def _verifier_layer_ids(verifier_layer_ids, target_layer_ids, verifier_hidden_size) -> list[int] | None:
    """The layers a conditioned drafter reads, given under either name (transformers' is `target_layer_ids`)."""
    if target_layer_ids is not None and verifier_layer_ids is not None and \
            list(target_layer_ids) != list(verifier_layer_ids):
        raise ValueError("target_layer_ids and verifier_layer_ids name the same layers: give one, or equal lists")
    layer_ids = verifier_layer_ids if verifier_layer_ids is not None else target_layer_ids
    if layer_ids is None:
        return None
    layer_ids = [int(i) for i in layer_ids]
    if not layer_ids or min(layer_ids) < 0 or not verifier_hidden_size:
        raise ValueError("a conditioned drafter needs a non-empty list of verifier_layer_ids (>= 0) and "
                         "the verifier_hidden_size")
    return layer_ids


def _check_dflash_layout(config: SpecDiffConfig, mask_token_id: int | None):
    if config.verifier_layer_ids is None:
        raise ValueError("the dflash layout reads the verifier's hidden states: give target_layer_ids (or "
                         "verifier_layer_ids) and verifier_hidden_size")
    if config.hidden_size != config.verifier_hidden_size:
        raise ValueError(f"the dflash layout runs at the verifier's width: hidden_size ({config.hidden_size}) must "
                         f"equal verifier_hidden_size ({config.verifier_hidden_size})")
    if config.block_size < 2:
        raise ValueError("the dflash layout's block_size counts the anchor token: it must be >= 2")
    if mask_token_id is None or not 0 <= mask_token_id < config.vocab_size:
        raise ValueError(f"the dflash layout needs a mask_token_id in the verifier's vocabulary [0, "
                         f"{config.vocab_size}), got {mask_token_id}")


__all__ = ["SpecDiffConfig", "UNMASKING_SCHEDULES", "LAYOUTS"]
