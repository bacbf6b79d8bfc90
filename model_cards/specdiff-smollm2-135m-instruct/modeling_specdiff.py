"""The SpecDiff drafter: a masked (absorbing-state) block-diffusion transformer that drafts for a verifier.

A Llama-style body (RMSNorm, RoPE, SwiGLU, grouped-query attention) over the verifier's vocabulary plus one mask
token. Attention follows an explicit boolean mask, so one forward can mix a causal prefix with a bidirectional
draft block (inference) or a clean copy of a sequence with its noised copy (training). `generate()` is the
drafting round that transformers' assisted generation calls (`model.generate(..., assistant_model=drafter)`).

A conditioned drafter (`config.verifier_layer_ids`) replaces the encoded prefix by the verifier's own hidden states:
each layer projects them to keys and values the block attends to. `drafter.attach(verifier)` records them with
forward hooks for the plain `assistant_model=` path.

This file ships to the Hub as remote code: it imports only torch and transformers.
"""

import copy
import functools
import os
import weakref

import torch
import torch.nn.functional as F
from torch import nn

from transformers import GenerationConfig, GenerationMixin, LogitsProcessorList, PreTrainedModel
from transformers import initialization as init
from transformers.cache_utils import Cache
from transformers.generation.logits_process import (
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)
from transformers.generation.utils import GenerateDecoderOnlyOutput
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast

from .configuration_specdiff import SpecDiffConfig
from .costs_specdiff import CostProfile, RoundCosts, cost_profile, device_clock
from .generation_specdiff import SpecDiffCache, VerifierFeatures, VerifierHooks, draft_block, point_mass_scores
from .policies_specdiff import LOOKUP_NGRAM, LOOKUP_TOKENS, AcceptanceRates, AssistantRounds, DraftLengthPolicy

# The field outputs hold the cache in: `cache` from transformers 5.24 on (the old name still works, with a warning).
CACHE_FIELD = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"

# The drafter's own `num_assistant_tokens_schedule`: transformers' loop asks for `num_assistant_tokens` (the block
# size) every round and the drafter drafts as many as its `DraftLengthPolicy` finds worth verifying. transformers
# treats any value but "heuristic*" as constant; set "constant" to always draft what the loop asks for.
ADAPTIVE_SCHEDULE = "adaptive"


class SpecDiffRMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class SpecDiffRotaryEmbedding(nn.Module):
    """RoPE angles, computed on the fly (no buffer to initialise or load)."""

    def __init__(self, config: SpecDiffConfig):
        super().__init__()
        self.head_dim = config.head_dim
        self.theta = config.rope_theta

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        exponent = torch.arange(0, self.head_dim, 2, dtype=torch.float, device=x.device) / self.head_dim
        freqs = position_ids[..., None].float() / self.theta**exponent  # [batch, seq, head_dim/2]
        emb = torch.cat([freqs, freqs], dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return x * cos[:, None] + rotate_half(x) * sin[:, None]


class SpecDiffAttention(nn.Module):
    """Grouped-query attention under an explicit boolean mask, reading and extending the prefix cache.

    With `context` (a conditioned drafter's projected verifier features), the keys and values of the context rows
    come first and the queries are the inputs' only; `cos`/`sin` then cover context + inputs.
    """

    def __init__(self, config: SpecDiffConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.q_proj = nn.Linear(config.hidden_size, self.num_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, config.hidden_size, bias=False)
        if config.qk_norm:
            self.q_norm = SpecDiffRMSNorm(self.head_dim, config.rms_norm_eps)
            self.k_norm = SpecDiffRMSNorm(self.head_dim, config.rms_norm_eps)

    def forward(self, hidden, cos, sin, attention_mask, cache, num_prefix_tokens: int,
                context: torch.Tensor | None = None):
        """`cache` is a `SpecDiffCache` (the first `num_prefix_tokens` keys and values are appended to it) or the
        `DFlashCache` of transformers' DFlash loop (every key and value is appended; the loop crops the block)."""
        batch, seq, _ = hidden.shape
        kv_input = hidden if context is None else torch.cat([context, hidden], dim=1)
        q = self.q_proj(hidden).view(batch, seq, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(kv_input).view(batch, kv_input.shape[1], self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(kv_input).view(batch, kv_input.shape[1], self.num_kv_heads, self.head_dim).transpose(1, 2)
        if hasattr(self, "q_norm"):
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rotary(q, cos[:, -seq:], sin[:, -seq:]), apply_rotary(k, cos, sin)
        if isinstance(cache, Cache):
            keys, values = cache.update(k, v, self.layer_idx)
        else:
            past = cache.layer(self.layer_idx) if cache is not None else None
            keys, values = (torch.cat([past[0], k], 2), torch.cat([past[1], v], 2)) if past is not None else (k, v)
            if cache is not None and num_prefix_tokens:
                cache.append(self.layer_idx, k[:, :, :num_prefix_tokens], v[:, :, :num_prefix_tokens])
        out = F.scaled_dot_product_attention(
            q, keys, values, attn_mask=attention_mask, enable_gqa=self.num_kv_heads != self.num_heads
        )
        return self.o_proj(out.transpose(1, 2).reshape(batch, seq, -1))


class SpecDiffMLP(nn.Module):
    def __init__(self, config: SpecDiffConfig):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class SpecDiffDecoderLayer(nn.Module):
    def __init__(self, config: SpecDiffConfig, layer_idx: int):
        super().__init__()
        self.input_layernorm = SpecDiffRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = SpecDiffAttention(config, layer_idx)
        self.post_attention_layernorm = SpecDiffRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = SpecDiffMLP(config)

    def forward(self, hidden, cos, sin, attention_mask, cache, num_prefix_tokens, context=None):
        hidden = hidden + self.self_attn(self.input_layernorm(hidden), cos, sin, attention_mask, cache,
                                         num_prefix_tokens, context)
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class SpecDiffPreTrainedModel(PreTrainedModel):
    config_class = SpecDiffConfig
    config: SpecDiffConfig
    base_model_prefix = "model"
    _no_split_modules = ["SpecDiffDecoderLayer"]
    _supports_sdpa = True

    def _init_weights(self, module):
        std = self.config.initializer_range
        if isinstance(module, (nn.Linear, nn.Embedding)):
            init.normal_(module.weight, mean=0.0, std=std)
        elif isinstance(module, SpecDiffRMSNorm):
            init.ones_(module.weight)


class SpecDiffModel(SpecDiffPreTrainedModel):
    """The transformer body: embeddings (vocabulary + mask token), decoder layers and the final norm; for a
    conditioned drafter also the projection that fuses the verifier's layers into one context vector per token."""

    def __init__(self, config: SpecDiffConfig):
        super().__init__(config)
        # The dflash layout embeds with the verifier's table: the drafter passes `inputs_embeds`.
        self.embed_tokens = None if config.uses_verifier_weights else nn.Embedding(config.vocab_size + 1,
                                                                                   config.hidden_size)
        if config.is_conditioned:
            width = len(config.verifier_layer_ids) * config.verifier_hidden_size
            self.context_proj = nn.Linear(width, config.hidden_size, bias=False)
            self.context_norm = SpecDiffRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.layers = nn.ModuleList(SpecDiffDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = SpecDiffRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary_emb = SpecDiffRotaryEmbedding(config)
        self.post_init()

    def get_input_embeddings(self):
        return self.embed_tokens

    def set_input_embeddings(self, value):
        self.embed_tokens = value

    def forward(self, input_ids=None, position_ids=None, attention_mask=None, past_key_values=None,
                num_prefix_tokens=0, verifier_features=None, inputs_embeds=None):
        hidden = self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        context = None
        if self.config.is_conditioned:
            if verifier_features is None:
                raise ValueError(_NEEDS_VERIFIER)
            context = self.context_norm(self.context_proj(verifier_features.to(self.context_proj.weight.dtype)))
            num_prefix_tokens = context.shape[1]
        num_inputs = num_prefix_tokens if context is not None else 0
        if position_ids is None:
            start = past_key_values.get_seq_length() - past_key_values.offset if past_key_values is not None else 0
            position_ids = torch.arange(start, start + num_inputs + hidden.shape[1], device=hidden.device)[None]
        if attention_mask is None and context is None:  # causal over the input, after the whole cache
            past = position_ids.shape[1] and int(position_ids[0, 0])
            attention_mask = torch.ones(hidden.shape[1], past + hidden.shape[1], dtype=torch.bool,
                                        device=hidden.device).tril(past)[None, None]
        cos, sin = self.rotary_emb(hidden, position_ids)
        for layer in self.layers:
            hidden = layer(hidden, cos, sin, attention_mask, past_key_values, num_prefix_tokens, context)
        return self.norm(hidden)


_NEEDS_VERIFIER_WEIGHTS = (
    "This SpecDiff drafter has the dflash layout: it embeds and predicts with the verifier's embedding table and head, "
    "which it does not store. Give it the verifier: drafter.set_verifier(verifier) or drafter.attach(verifier), or "
    "use hf_specdiff.generate(verifier, drafter, ...) or verifier.generate(..., assistant_model=drafter, "
    "speculation_type='dflash')."
)

_NEEDS_VERIFIER = (
    "This SpecDiff drafter is conditioned on the verifier's hidden states (config.verifier_layer_ids), so it cannot "
    "draft from tokens alone. Use hf_specdiff.generate(verifier, drafter, ...), or "
    "verifier.generate(..., assistant_model=drafter.attach(verifier))."
)


class VerifierWeights:
    """The verifier's embedding table and head, as a `"dflash"`-layout drafter uses them: embeddings without the
    verifier's optional `embed_norm` (as transformers' DFlash loop embeds the block), logits through a detached
    head (the drafter trains, the verifier does not), restricted to the draft vocabulary's rows when it is reduced.
    Held outside the module tree, so they are neither saved nor moved with the drafter."""

    def __init__(self, verifier, vocab_size: int):
        self.embeddings = verifier.get_input_embeddings()
        self.head = verifier.get_output_embeddings()
        if self.head is None or self.head.weight.shape[0] != vocab_size:
            raise ValueError(f"the verifier's head must predict the drafter's {vocab_size} tokens")
        self._rows: tuple | None = None  # (key, weight rows of the draft vocabulary)

    @torch.no_grad()
    def embed(self, input_ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        embed_norm = getattr(self.embeddings, "embed_norm", None)
        if embed_norm is None:
            return self.embeddings(input_ids.to(self.embeddings.weight.device)).to(dtype)
        try:
            self.embeddings.embed_norm = nn.Identity()
            return self.embeddings(input_ids.to(self.embeddings.weight.device)).to(dtype)
        finally:
            self.embeddings.embed_norm = embed_norm

    def logits(self, hidden: torch.Tensor, draft_ids: torch.Tensor | None) -> torch.Tensor:
        weight, bias = self.head.weight.detach(), getattr(self.head, "bias", None)
        if draft_ids is not None:
            key = (weight.data_ptr(), weight.dtype, weight.device, draft_ids.shape[0])
            if self._rows is None or self._rows[0] != key:
                self._rows = (key, weight[draft_ids.to(weight.device)].contiguous())
            weight = self._rows[1]
            bias = bias[draft_ids] if bias is not None else None
        return F.linear(hidden.to(weight.dtype), weight, None if bias is None else bias.detach())


class SpecDiffDrafter(SpecDiffPreTrainedModel, GenerationMixin):
    """A SpecDiff drafter: pass it to a verifier's `generate(..., assistant_model=drafter)`.

    `forward` returns logits over the verifier's vocabulary for every input position; `generate` drafts up to
    `config.max_draft_tokens` tokens after `input_ids` in `config.num_denoising_steps` forwards and returns them with the
    processed logits each was drawn from, as transformers' assisted decoding expects.
    """

    def __init__(self, config: SpecDiffConfig):
        super().__init__(config)
        self.model = SpecDiffModel(config)
        head_size = len(config.draft_token_ids) if config.draft_token_ids is not None else config.vocab_size
        # The dflash layout predicts with the verifier's head (`set_verifier`).
        self.lm_head = None if config.uses_verifier_weights else nn.Linear(config.hidden_size, head_size, bias=False)
        self._verifier_weights: VerifierWeights | None = None
        self._draft_ids: torch.Tensor | None = None
        self._hooks: VerifierHooks | None = None
        self._verifier = None  # a weak reference to the verifier `set_verifier` paired it with
        self.post_init()
        self.generation_config.num_assistant_tokens = config.max_draft_tokens
        self.generation_config.num_assistant_tokens_schedule = ADAPTIVE_SCHEDULE
        self.generation_config.assistant_confidence_threshold = 0.0

    @property
    def assistant_lookup_tokens(self) -> int:
        """The drop-in path's prompt-lookup drafts, in rounds where they are expected to pay more than the drafter's:
        at most this many tokens (0: the drafter's own drafts only). Kept in `generation_config`."""
        return getattr(self.generation_config, "assistant_lookup_tokens", LOOKUP_TOKENS)

    @assistant_lookup_tokens.setter
    def assistant_lookup_tokens(self, value: int):
        if value < 0:
            raise ValueError(f"assistant_lookup_tokens must be >= 0, got {value}")
        self.generation_config.assistant_lookup_tokens = value

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, **kwargs):
        """`PreTrainedModel.from_pretrained`, with errors that say what is wrong with a local drafter folder."""
        if isinstance(pretrained_model_name_or_path, (str, os.PathLike)):
            _check_local_folder(os.fspath(pretrained_model_name_or_path))
        try:
            return super().from_pretrained(pretrained_model_name_or_path, *args, **kwargs)
        except Exception as error:
            if type(error).__name__ == "SafetensorError":  # a truncated or corrupt weights file
                raise ValueError(f"The drafter's weights in {pretrained_model_name_or_path} cannot be read ({error}): "
                                 "the file is damaged or incomplete; copy or download it again.") from error
            raise

    def get_input_embeddings(self):
        if self.config.uses_verifier_weights:
            return self._verifier_weights.embeddings if self._verifier_weights is not None else None
        return self.model.embed_tokens

    def set_input_embeddings(self, value):
        self.model.embed_tokens = value

    def get_output_embeddings(self):
        if self.config.uses_verifier_weights:
            return self._verifier_weights.head if self._verifier_weights is not None else None
        return self.lm_head

    def set_verifier(self, verifier) -> "SpecDiffDrafter":
        """Pair this drafter with `verifier`: `check_verifier`, then give a `"dflash"`-layout drafter the verifier's
        embedding table and head, which it drafts with (they stay the verifier's: not saved with the drafter, not
        trained). `attach`, `hf_specdiff.generate` and the trainer call it."""
        self.check_verifier(verifier)
        self._verifier = weakref.ref(verifier)
        if self.config.uses_verifier_weights:
            self._verifier_weights = VerifierWeights(verifier, self.config.vocab_size)
        return self

    def _verifier_weights_or_raise(self) -> "VerifierWeights":
        if self._verifier_weights is None:
            raise ValueError(_NEEDS_VERIFIER_WEIGHTS)
        return self._verifier_weights

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        """Head logits [..., head_size] of final hidden states (over the draft vocabulary when it is reduced)."""
        if self.lm_head is not None:
            return self.lm_head(hidden)
        return self._verifier_weights_or_raise().logits(hidden, self.draft_vocab_ids(hidden.device))

    def draft_vocab_ids(self, device=None) -> torch.Tensor | None:
        """The verifier ids of the head's outputs [head_size], or `None` when the head covers the whole vocabulary."""
        if self.config.draft_token_ids is None:
            return None
        device = device or self.device
        if self._draft_ids is None or self._draft_ids.device != torch.device(device):
            self._draft_ids = torch.tensor(self.config.draft_token_ids, dtype=torch.long, device=device)
        return self._draft_ids

    def to_draft_vocab(self, ids: torch.Tensor) -> torch.Tensor:
        """Map verifier token ids to head indices (-1 for tokens outside the draft vocabulary)."""
        draft_ids = self.draft_vocab_ids(ids.device)
        if draft_ids is None:
            return ids
        lookup = torch.full((self.config.vocab_size,), -1, dtype=torch.long, device=ids.device)
        lookup[draft_ids] = torch.arange(draft_ids.shape[0], device=ids.device)
        return lookup[ids]

    def to_full_vocab(self, logits: torch.Tensor) -> torch.Tensor:
        """Head logits [..., head_size] as logits over the verifier's vocabulary (-inf outside the draft vocabulary)."""
        draft_ids = self.draft_vocab_ids(logits.device)
        if draft_ids is None:
            return logits
        full = logits.new_full((*logits.shape[:-1], self.config.vocab_size), float("-inf"))
        return full.index_copy_(-1, draft_ids, logits)

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        position_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        past_key_values: SpecDiffCache | None = None,
        num_prefix_tokens: int = 0,
        logits_to_keep: int | slice = 0,
        head_logits: bool = False,
        verifier_features: torch.Tensor | None = None,
        noise_embeds: torch.Tensor | None = None,
        context_hidden_states: torch.Tensor | None = None,
        **kwargs,
    ) -> CausalLMOutputWithPast | BaseModelOutputWithPast:
        """Logits [batch, seq, vocab_size] over the verifier's vocabulary for every input position.

        Called as transformers' DFlash loop calls a DFlash drafter (`noise_embeds`, `context_hidden_states`,
        `position_ids`, `attention_mask`, `past_key_values=DFlashCache`), a `"dflash"`-layout drafter returns the
        final hidden states of the block instead (`last_hidden_state`), which the loop turns into logits with the
        verifier's head.

        Args:
            verifier_features: conditioned drafters only: [batch, n, len(verifier_layer_ids) * verifier_hidden_size],
                the verifier's layer outputs at the n context positions that come before the inputs (their keys and
                values are appended to the cache). `position_ids` and `attention_mask` then cover context + inputs
                as keys; `attention_mask=None` lets every input attend to everything.
            attention_mask: boolean [batch or 1, 1, seq, cached + seq], True where a query may attend. `None` means
                causal attention over the inputs (after the whole cache).
            past_key_values: the prefix cache. The keys and values of the first `num_prefix_tokens` inputs are
                appended to it; the rest (the draft block) are attended to but not cached.
            logits_to_keep: if > 0, compute logits for the last `logits_to_keep` positions only; a `slice` keeps
                those positions.
            head_logits: return the head's logits as they are (over the draft vocabulary when it is reduced).
        """
        past_key_values = kwargs.pop("cache", past_key_values)  # the name transformers uses from 5.24 on
        if noise_embeds is not None:
            return self._dflash_forward(noise_embeds, context_hidden_states, position_ids, attention_mask,
                                        past_key_values)
        embeds = self._verifier_weights_or_raise().embed(input_ids, self.dtype) \
            if self.config.uses_verifier_weights else None
        hidden = self.model(input_ids if embeds is None else None, position_ids, attention_mask, past_key_values,
                            num_prefix_tokens, verifier_features, inputs_embeds=embeds)
        if isinstance(logits_to_keep, slice):
            hidden = hidden[:, logits_to_keep]
        elif logits_to_keep:
            hidden = hidden[:, -logits_to_keep:]
        logits = self.head(hidden)
        return CausalLMOutputWithPast(logits=logits if head_logits else self.to_full_vocab(logits),
                                      **{CACHE_FIELD: past_key_values})

    def _dflash_forward(self, noise_embeds, context_hidden_states, position_ids, attention_mask, past_key_values):
        """transformers' DFlash contract: the block's final hidden states [batch, block, hidden]."""
        if not self.config.uses_verifier_weights:
            raise ValueError("speculation_type='dflash' needs a drafter of layout 'dflash' (it embeds and predicts "
                             "with the verifier's weights); call this drafter with assistant_model= alone.")
        if context_hidden_states is None:
            raise ValueError("the DFlash call needs context_hidden_states (the verifier's features)")
        if attention_mask is not None and not bool(attention_mask.all()):
            raise ValueError("SpecDiffDrafter does not take padded inputs: pass an unpadded single prompt.")
        hidden = self.model(position_ids=position_ids, past_key_values=past_key_values,
                            verifier_features=context_hidden_states, inputs_embeds=noise_embeds.to(self.dtype))
        # the loop applies the verifier's head next: hand the states over in the verifier's dtype (the embeddings'),
        # so a drafter loaded as saved (bf16) works beside a verifier in another dtype
        return BaseModelOutputWithPast(last_hidden_state=hidden.to(noise_embeds.dtype),
                                       **{CACHE_FIELD: past_key_values})

    def _check_inputs(self, input_ids, attention_mask, num_tokens, new_sequence: bool = True):
        """Raise an error naming the fix for inputs this drafter cannot draft after. The token ids and the mask are
        read (a host sync on a GPU) for a new sequence only: later calls extend it with the verifier's tokens."""
        if input_ids.shape[0] != 1:
            raise ValueError(
                f"SpecDiffDrafter drafts for one sequence at a time (got batch size {input_ids.shape[0]}); "
                "call generate once per prompt."
            )
        if new_sequence and attention_mask is not None and not bool(attention_mask.all()):
            raise ValueError("SpecDiffDrafter does not take padded inputs: pass an unpadded single prompt.")
        if input_ids.shape[1] == 0:
            raise ValueError("The prompt is empty: pass at least one token (for example the BOS token).")
        if not 1 <= num_tokens <= self.config.max_draft_tokens:
            raise ValueError(
                f"Asked for {num_tokens} draft tokens but this drafter drafts at most {self.config.max_draft_tokens}: "
                "lower `num_assistant_tokens` in `drafter.generation_config` (or `max_new_tokens`) to at most that."
            )
        if not new_sequence:
            return
        low, high = torch.stack([input_ids.min(), input_ids.max()]).tolist()
        if low < 0 or high >= self.config.vocab_size:
            raise ValueError(
                f"Token id {high if high >= self.config.vocab_size else low} is outside the drafter's vocabulary "
                f"({self.config.vocab_size}): the drafter was made for another tokenizer. Use a drafter trained for "
                "this verifier."
            )

    @property
    def verifier_hidden_states(self) -> list[int]:
        """Indices into the verifier's `hidden_states` output this drafter reads (`output_hidden_states=` value)."""
        return [i + 1 for i in self.config.verifier_layer_ids]

    def select_features(self, hidden_states) -> torch.Tensor:
        """The features [batch, seq, F] a conditioned drafter reads, from a verifier output's `hidden_states`."""
        return torch.cat([hidden_states[i] for i in self.verifier_hidden_states], dim=-1)

    def check_verifier(self, verifier):
        """Raise `ValueError` naming the fix if this drafter cannot draft for `verifier` (a model or its config): another
        vocabulary, or, for a conditioned drafter, verifier layers it cannot read (count or width differ)."""
        text = getattr(verifier, "config", verifier)
        text = text.get_text_config() if hasattr(text, "get_text_config") else text
        if text.vocab_size != self.config.vocab_size:
            raise ValueError(
                f"The drafter's vocab_size ({self.config.vocab_size}) differs from the verifier's ({text.vocab_size}): "
                "a drafter works only with the tokenizer (and padded vocabulary) it was made for. Train one for this "
                "verifier with `hf-specdiff train --verifier ...`, or build its config with "
                "`hf_specdiff.compat.drafter_config_for(verifier)`."
            )
        if self.config.is_conditioned and (text.hidden_size != self.config.verifier_hidden_size or
                                           max(self.config.verifier_layer_ids) >= text.num_hidden_layers - 1):
            raise ValueError(
                f"This drafter reads verifier layers {self.config.verifier_layer_ids} of width "
                f"{self.config.verifier_hidden_size}, but the verifier has {text.num_hidden_layers} layers of width "
                f"{text.hidden_size}. Use a drafter trained for this verifier."
            )

    def attach(self, verifier) -> "SpecDiffDrafter":
        """Hook this conditioned drafter onto `verifier` for `verifier.generate(..., assistant_model=drafter)`.

        Forward hooks on the verifier record its hidden states at `config.verifier_layer_ids` after every
        single-sequence forward; they change no output, so the verifier can still be used without the drafter.
        `detach()` removes them. Returns the drafter. Standalone drafters need no attaching (it is a no-op).
        """
        self.set_verifier(verifier)
        if not self.config.is_conditioned:
            return self
        self.detach()
        self._hooks = VerifierHooks(verifier, self.config.verifier_layer_ids, VerifierFeatures())
        return self

    def detach(self) -> "SpecDiffDrafter":
        """Remove the hooks `attach` put on the verifier."""
        if self._hooks is not None:
            self._hooks.remove()
            self._hooks = None
        return self

    def new_cache(self) -> SpecDiffCache:
        """An empty prefix cache for one generation."""
        return SpecDiffCache()

    def draft(
        self,
        input_ids: torch.LongTensor,
        cache: SpecDiffCache,
        num_tokens: int,
        logits_processor: list | None = None,
        do_sample: bool = False,
        num_steps: int | None = None,
    ) -> tuple[torch.LongTensor, torch.Tensor]:
        """Draft `num_tokens` tokens after `input_ids` [1, seq] in `num_steps` denoising steps (default: the config's).

        Returns the draft [1, num_tokens] and the processed logits [num_tokens, vocab] each token was drawn from.
        With `num_steps=1` the logits are the per-position marginals of one forward (what self-selection samples).
        """
        return draft_block(
            self,
            input_ids,
            cache,
            num_tokens,
            LogitsProcessorList(logits_processor or []),
            do_sample=do_sample,
            num_steps=num_steps or self.config.num_denoising_steps,
            schedule=self.config.unmasking_schedule,
        )

    def cost_profile(self, verifier=None, measure: bool = True, fresh: bool = False) -> CostProfile | None:
        """This machine's `CostProfile` for this drafter beside `verifier` (default: the one `set_verifier` or
        `attach` paired it with; None if there is none), measured on first use (or again, `fresh`) and cached per
        machine and models. A `verifier` given here is paired with the drafter (`set_verifier`): measuring runs the
        drafter beside it."""
        if verifier is not None and (self._verifier is None or self._verifier() is not verifier):
            self.set_verifier(verifier)
        verifier = self._verifier() if self._verifier is not None else None
        return None if verifier is None else cost_profile(verifier, self, measure=measure, fresh=fresh)

    def new_length_policy(self, max_length: int | None = None, fixed: int | None = None,
                          profile: CostProfile | None = None, drafted: bool = True) -> DraftLengthPolicy:
        """A fresh `DraftLengthPolicy` for drafts of at most `max_length` tokens (default: the block size), its round
        costs from `profile` (with this drafter's call where `drafted`, which it may then spend alone on a shadow
        probe; prompt-lookup drafts have none)."""
        prior = None if profile is None else functools.partial(profile.round_seconds, drafted=drafted)
        draft_seconds = profile.drafter_seconds if profile is not None and drafted else None
        return DraftLengthPolicy(max_length or self.config.max_draft_tokens, fixed, costs=RoundCosts(prior=prior),
                                 draft_seconds=draft_seconds)

    def new_lookup_policies(self, max_length: int, profile: CostProfile | None) -> list[DraftLengthPolicy]:
        """Fresh policies for prompt lookup's drafts of at most `max_length` tokens (none if 0), one per n-gram size
        n = 1..`LOOKUP_NGRAM` matched, sharing one `RoundCosts` (a lookup round costs the same whatever it matched)."""
        if not max_length:
            return []
        first = self.new_length_policy(max_length, profile=profile, drafted=False)
        return [first] + [DraftLengthPolicy(max_length, costs=first.costs) for _ in range(LOOKUP_NGRAM - 1)]

    @staticmethod
    def new_round_costs(profile: CostProfile | None) -> RoundCosts:
        """Fresh measured costs of tree rounds by nodes verified, from `profile`'s verifier forwards (the drafter's
        call is left out: a tree is sized after it ran)."""
        return RoundCosts(prior=None if profile is None else lambda nodes: profile.verifier_seconds(nodes + 1))

    @staticmethod
    def new_acceptance_rates(max_length: int, first_prior: float = 0.5, decay: float = 1.0) -> AcceptanceRates:
        """Fresh acceptance-by-position counts for drafts of at most `max_length` tokens, an untried first position
        at `first_prior`, older rounds weighed down by `decay` (the tree loop keeps one for each of its prompt-lookup
        branches)."""
        return AcceptanceRates(max_length, first_prior, decay)

    def _assistant_rounds(self, cache: SpecDiffCache, generation_config) -> AssistantRounds | None:
        """The round tracker of an adaptive drafter called by transformers' assisted loop (None otherwise)."""
        if not generation_config.is_assistant or \
                self.generation_config.num_assistant_tokens_schedule != ADAPTIVE_SCHEDULE:
            return None
        if cache.assistant_rounds is None:  # a new generation
            profile = self.cost_profile()
            lookup_policies = self.new_lookup_policies(self.assistant_lookup_tokens, profile)
            cache.assistant_rounds = AssistantRounds(self.new_length_policy(profile=profile), lookup_policies)
            cache.verifier_kernels = None if profile is None else profile.verifier_kernels(self._verifier())
        return cache.assistant_rounds

    @torch.no_grad()
    def generate(
        self,
        input_ids: torch.LongTensor,
        generation_config: GenerationConfig | None = None,
        logits_processor: list | None = None,
        attention_mask: torch.Tensor | None = None,
        past_key_values: SpecDiffCache | None = None,
        max_new_tokens: int | None = None,
        **kwargs,
    ) -> GenerateDecoderOnlyOutput:
        """Draft up to `config.max_draft_tokens` tokens after `input_ids` ([1, seq]).

        Called by transformers' `AssistedCandidateGenerator` with the verifier's generation config and its logits
        processors (which already hold temperature/top-k/top-p when sampling); called directly, the sampling
        settings come from `generation_config` and keyword arguments. Returns `sequences` (input + draft), `scores`
        (one tensor [1, vocab] per draft token: the processed logits it was drawn from) and `past_key_values`
        (the prefix cache to pass back next round).

        Called by the assisted loop (`generation_config.is_assistant`) with the drafter's schedule "adaptive" (the
        default), it drafts as many of the tokens asked for as its length policy finds worth verifying: more where
        the drafter is accepted and an extra verified token is cheap on this machine, none where even one does not
        pay (probe rounds, rarer while they show that drafting does not pay, keep acceptance measured). Such a
        round proposes prompt lookup's draft instead (up to `assistant_lookup_tokens`, as many as its own policy
        finds worth verifying), with a point mass as its scores: under sampling the loop's speculative sampling then
        accepts a token with its probability under the verifier, which is lossless. With neither, a greedy round
        returns `input_ids` unchanged and one placeholder score, which transformers' loop stacks but, greedy without
        `assistant_ensemble_weight`, never reads: its verifier forward is then a plain greedy step (a sampled round
        drafts one token: the loop's sampling step needs one). The policies live in the drafter's cache, one
        generation long; paired with its verifier (`attach`), they start from this machine's `cost_profile`, and
        the verification forward after each call runs with the profile's kernels (`CostProfile.verifier_kernels`).
        """
        # a shallow copy takes the call's settings without touching the caller's config (a deep copy cost about
        # 1 ms a round here, copying tensors this method never reads)
        past_key_values = kwargs.pop("cache", past_key_values)  # the name transformers uses from 5.24 on
        generation_config = copy.copy(generation_config or self.generation_config)
        generation_config.update(**{k: v for k, v in kwargs.items() if hasattr(generation_config, k)})
        num_tokens = max_new_tokens or generation_config.max_new_tokens or self.config.max_draft_tokens
        self._check_inputs(input_ids, attention_mask, num_tokens, new_sequence=past_key_values is None)
        if past_key_values is None:
            past_key_values = SpecDiffCache()
        elif not isinstance(past_key_values, SpecDiffCache):
            raise TypeError(f"past_key_values must be the SpecDiffCache this drafter returned, got {type(past_key_values)}")
        if self.config.is_conditioned:
            if self._hooks is None:
                raise ValueError(_NEEDS_VERIFIER)
            past_key_values.verifier_features = self._hooks.features
        rounds = self._assistant_rounds(past_key_values, generation_config)
        if past_key_values.verifier_kernels is not None:  # the verification forward that follows this call
            past_key_values.verifier_kernels.next_forward()
        if rounds is not None:
            rounds.observe(input_ids)
            asked, (num_tokens, lookup) = num_tokens, rounds.next_draft(
                input_ids, num_tokens, _can_skip(generation_config, self.generation_config))
            if rounds.shadow_probe and asked:
                processors = _sampling_processors(generation_config) if logits_processor is None else logits_processor
                self._shadow_probe(input_ids, past_key_values, processors, rounds)
            if lookup:  # drafted from the context alone: a draw from a point mass, q = one-hot
                draft = input_ids.new_tensor([lookup])
                rounds.drafted(input_ids, draft)
                return GenerateDecoderOnlyOutput(sequences=torch.cat([input_ids, draft], dim=1),
                                                 scores=point_mass_scores(draft, self.config.vocab_size),
                                                 **{CACHE_FIELD: past_key_values})
        if num_tokens == 0:  # not worth a draft: the loop's verifier forward is then a plain step
            rounds.drafted(input_ids, input_ids[:, :0])
            return GenerateDecoderOnlyOutput(sequences=input_ids, scores=(input_ids.new_zeros(1, 1).float(),),
                                             **{CACHE_FIELD: past_key_values})
        if logits_processor is None:
            logits_processor = _sampling_processors(generation_config)
        draft, scores = self.draft(input_ids, past_key_values, num_tokens, logits_processor,
                                   do_sample=bool(generation_config.do_sample))
        if rounds is not None:
            rounds.drafted(input_ids, draft)
        return GenerateDecoderOnlyOutput(
            sequences=torch.cat([input_ids, draft], dim=1),
            scores=tuple(scores[:, None].unbind(0)),
            **{CACHE_FIELD: past_key_values},
        )

    def _shadow_probe(self, input_ids: torch.LongTensor, cache: SpecDiffCache, logits_processor,
                      rounds: AssistantRounds):
        """A greedy probe of the assisted loop that verifies nothing: a drafted token that `rounds` compares with the
        token the loop commits next, its seconds left out of the round's (which is a plain step)."""
        started = device_clock(self.device)
        draft = self.draft(input_ids, cache, 1, logits_processor)[0]
        rounds.shadowed(int(draft[0, 0]), device_clock(self.device) - started)


def _can_skip(generation_config, own_config) -> bool:
    """Whether transformers' assisted loop takes an empty draft: greedy, with no assistant ensemble and no
    confidence threshold (the drafter's own) that would read the draft's scores. (Its sampling step reads them at
    every drafted position, and needs at least one.)"""
    return not generation_config.do_sample and generation_config.assistant_ensemble_weight is None and \
        not own_config.assistant_confidence_threshold


def _check_local_folder(path: str):
    """Raise an error naming the problem if `path` is meant as a local drafter folder and is not a complete one."""
    if not os.path.exists(path):
        if os.path.isabs(path) or path.startswith((".", "~")) or path.count("/") > 1:  # a path, not a Hub id
            raise FileNotFoundError(f"no drafter at {path}: pass the folder of a saved SpecDiff drafter")
        return
    if not os.path.isdir(path):
        raise FileNotFoundError(f"{path} is a file: pass the folder of a saved SpecDiff drafter")
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise FileNotFoundError(f"{path} has no config.json, so it is not a saved SpecDiff drafter: pass the folder "
                                "that drafter.save_pretrained() or `hf-specdiff train --out` wrote.")
    if not any(name.endswith((".safetensors", ".bin")) for name in os.listdir(path)):
        raise FileNotFoundError(f"{path} has a config.json but no weights (model.safetensors): the folder is "
                                "incomplete; copy or download it again.")


def _sampling_processors(generation_config: GenerationConfig) -> LogitsProcessorList:
    """Temperature, top-k and top-p warpers for a direct `drafter.generate(do_sample=True, ...)` call."""
    processors = LogitsProcessorList()
    if not generation_config.do_sample:
        return processors
    if generation_config.temperature is not None and generation_config.temperature != 1.0:
        processors.append(TemperatureLogitsWarper(generation_config.temperature))
    if generation_config.top_k:
        processors.append(TopKLogitsWarper(generation_config.top_k))
    if generation_config.top_p is not None and generation_config.top_p < 1.0:
        processors.append(TopPLogitsWarper(generation_config.top_p))
    return processors


__all__ = ["SpecDiffDrafter", "SpecDiffModel", "SpecDiffPreTrainedModel"]
