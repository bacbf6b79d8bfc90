"""Pairing a drafter with a verifier: a config that matches it, and a check with errors that name the fix."""

from .configuration_specdiff import SpecDiffConfig

SPECIAL_TOKENS = ("bos_token_id", "eos_token_id", "pad_token_id")


def _verifier_text_config(verifier):
    config = getattr(verifier, "config", verifier)
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def _generation_token(verifier, name):
    """A special-token id as the verifier's generation sees it: its generation config first, then its config."""
    generation_config = getattr(verifier, "generation_config", None)
    value = getattr(generation_config, name, None) if generation_config is not None else None
    return value if value is not None else getattr(_verifier_text_config(verifier), name, None)


def default_verifier_layers(num_layers: int, count: int = 3) -> list[int]:
    """`count` verifier layers spread evenly from the second to the second-to-last (the last one is returned
    after the final norm, so conditioned drafters do not read it)."""
    last = num_layers - 2
    if last < 0:
        raise ValueError("a conditioned drafter needs a verifier with at least 2 layers")
    first = min(1, last)
    count = min(count, last - first + 1)
    return sorted({round(first + i * (last - first) / max(count - 1, 1)) for i in range(count)})


def verifier_layer_ids(spec: str, verifier) -> list[int]:
    """The verifier layers a setting like `--verifier-layers` names: '' none, 'auto' (`default_verifier_layers`),
    or a list like '1,14,28'."""
    if spec in ("", "auto"):
        return default_verifier_layers(_verifier_text_config(verifier).num_hidden_layers) if spec else []
    if not all(part.strip().isdigit() for part in spec.split(",")):
        raise ValueError(f"verifier_layers must be empty, 'auto' or a list like '1,14,28', got {spec!r}")
    return [int(part) for part in spec.split(",")]


def verifier_rope_theta(text_config) -> float:
    """The RoPE base of a verifier's text config (transformers 5 keeps it in `rope_parameters`)."""
    rope = getattr(text_config, "rope_parameters", None) or {}
    rope = rope.get("full_attention", rope)  # per layer type (Gemma-3)
    return float(rope.get("rope_theta", getattr(text_config, "rope_theta", 10000.0)))


def dflash_sizes(verifier) -> dict:
    """The body sizes of a dflash-layout drafter for `verifier`: its width, heads, MLP, norm epsilon and RoPE base."""
    text = _verifier_text_config(verifier)
    heads = text.num_attention_heads
    return dict(hidden_size=text.hidden_size, intermediate_size=text.intermediate_size, num_attention_heads=heads,
                num_key_value_heads=getattr(text, "num_key_value_heads", None) or heads,
                head_dim=getattr(text, "head_dim", None) or text.hidden_size // heads,
                rms_norm_eps=getattr(text, "rms_norm_eps", 1e-6), rope_theta=verifier_rope_theta(text))


def drafter_config_for(verifier, conditioned: bool = False, **kwargs) -> SpecDiffConfig:
    """A `SpecDiffConfig` whose vocabulary and special tokens match `verifier` (a model or its config).

    `conditioned=True` makes a drafter that reads the verifier's hidden states (layers from
    `default_verifier_layers` unless `verifier_layer_ids` is given). Keyword arguments set the other fields (sizes,
    `block_size`, `num_denoising_steps`, ...).
    """
    text_config = _verifier_text_config(verifier)
    matched = {name: _generation_token(verifier, name) for name in SPECIAL_TOKENS}
    matched["vocab_size"] = text_config.vocab_size
    matched["verifier_name_or_path"] = getattr(text_config, "_name_or_path", None) or None
    if conditioned:
        matched["verifier_layer_ids"] = default_verifier_layers(text_config.num_hidden_layers)
        matched["verifier_hidden_size"] = text_config.hidden_size
        matched["verifier_num_layers"] = text_config.num_hidden_layers
    return SpecDiffConfig(**{**matched, **kwargs})


def check_compatibility(verifier, drafter) -> None:
    """Raise `ValueError` naming the fix if `drafter` cannot draft for `verifier` (vocabulary or special tokens)."""
    drafter.check_verifier(verifier)
    for name in SPECIAL_TOKENS:
        theirs, ours = _generation_token(verifier, name), getattr(drafter.config, name, None)
        if theirs is not None and ours is not None and not _ids(theirs) & _ids(ours):
            raise ValueError(
                f"The verifier's {name} ({theirs}) differs from the drafter's ({ours}). If the drafter was made for "
                f"this tokenizer, set `drafter.config.{name} = {theirs!r}`; otherwise use a drafter made for this verifier."
            )


def _ids(value) -> set:
    return set(value) if isinstance(value, (list, tuple)) else {value}
