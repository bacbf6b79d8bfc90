"""Exports of a dflash-layout drafter for the engines that already run DFlash drafters.

    hf-specdiff export DRAFTER OUT --format transformers   # transformers' own DFlash model: no remote code
    hf-specdiff export DRAFTER OUT --format dflash         # z-lab's layout: vLLM, SGLang, z-lab/dflash

The weights map one to one (the dflash layout was built for it); only names and config fields change. Neither
format stores the verifier's embeddings or head: the engine takes them from the verifier, and predicts over the
whole vocabulary (a reduced draft vocabulary is a speed-up of our own loops only).
"""

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

EXPORT_FORMATS = ("transformers", "dflash")

# our state-dict prefix -> the format's (the rest of a name is the same in all three)
_RENAMES = {
    "transformers": {"model.context_proj.": "encoder.fc.", "model.context_norm.": "encoder.output_norm_enc.",
                     "model.layers.": "layers.", "model.norm.": "norm."},
    "dflash": {"model.context_proj.": "fc.", "model.context_norm.": "hidden_norm.", "model.layers.": "layers.",
               "model.norm.": "norm."},
}


def export_state_dict(drafter, export_format: str) -> dict[str, torch.Tensor]:
    """The drafter's weights under the names `export_format` loads."""
    renames = _RENAMES[export_format]
    out = {}
    for name, tensor in drafter.state_dict().items():
        prefix = next((p for p in renames if name.startswith(p)), None)
        if prefix is None:
            raise ValueError(f"no {export_format} name for drafter weight {name}")
        out[renames[prefix] + name[len(prefix):]] = tensor.detach().contiguous().clone()
    return out


def _common_fields(config) -> dict:
    return dict(hidden_size=config.hidden_size, intermediate_size=config.intermediate_size,
                num_hidden_layers=config.num_hidden_layers, num_attention_heads=config.num_attention_heads,
                num_key_value_heads=config.num_key_value_heads, head_dim=config.head_dim,
                rms_norm_eps=config.rms_norm_eps, max_position_embeddings=config.max_position_embeddings,
                hidden_act="silu", bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id,
                pad_token_id=config.pad_token_id, block_size=config.block_size, tie_word_embeddings=False,
                layer_types=["full_attention"] * config.num_hidden_layers)


def transformers_config(config) -> dict:
    """config.json of transformers' `muse_glimmer_assistant` DFlash model (full attention in every layer)."""
    return {"model_type": "muse_glimmer_assistant", "architectures": ["MuseGlimmerAssistantModel"],
            **_common_fields(config), "rope_parameters": {"rope_type": "default", "rope_theta": config.rope_theta},
            "mask_token_id": config.mask_token_id, "target_layer_ids": list(config.target_layer_ids)}


def dflash_config(config, num_target_layers: int) -> dict:
    """config.json of z-lab's layout as vLLM (`qwen3_dflash.py`) and SGLang (`models/dflash.py`) read it: a Qwen3
    config plus `block_size`, `num_target_layers` and `dflash_config`."""
    return {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", **_common_fields(config),
            "vocab_size": config.vocab_size, "attention_bias": False, "rope_theta": config.rope_theta,
            "rope_scaling": None, "num_target_layers": num_target_layers,
            "dflash_config": {"mask_token_id": config.mask_token_id, "target_layer_ids": list(config.target_layer_ids),
                              "block_size": config.block_size}}


def export_card(config, export_format: str, verifier: str) -> str:
    """The model card of an export: the verifier as base_model, the tags the engines' drafters carry."""
    use = ("# in the verifier's dtype: transformers' DFlash loop feeds the drafter the verifier's hidden states and\n"
           "# applies the verifier's head to the drafter's output, so mixed dtypes fail there (m1 and m2 dtype)\n"
           "drafter = AutoModel.from_pretrained(THIS, dtype=verifier.dtype)\n"
           "verifier.generate(**inputs, assistant_model=drafter, speculation_type=\"dflash\")"
           if export_format == "transformers" else
           'vllm serve VERIFIER --speculative-config \'{"method": "dflash", "model": "THIS", '
           f'"num_speculative_tokens": {config.block_size - 1}}}\'')
    return (f"---\nbase_model: {verifier}\nlibrary_name: transformers\ntags:\n- speculative-decoding\n- dflash\n"
            f"- diffusion\n---\n\n# DFlash drafter for {verifier}\n\nA block-diffusion drafter of the DFlash layout "
            f"trained with hf_specdiff, exported in the `{export_format}` format. **It must be used with "
            f"{verifier}**: it reads that model's layers {list(config.target_layer_ids)} and drafts with its "
            f"embeddings and head.\n\n- {config.num_hidden_layers} layers at width {config.hidden_size}; block "
            f"{config.block_size} (the anchor and {config.block_size - 1} drafted tokens); mask token "
            f"{config.mask_token_id}\n\n```\n{use}\n```\n")


def export_drafter(drafter, out, export_format: str, num_target_layers: int | None = None) -> Path:
    """Write `drafter` (a dflash-layout `SpecDiffDrafter`) to folder `out` in `export_format`: weights, config and a
    model card. `num_target_layers` (the verifier's layer count, which the dflash format records) defaults to the
    one saved with the drafter."""
    if export_format not in EXPORT_FORMATS:
        raise ValueError(f"format must be one of {EXPORT_FORMATS}, got {export_format!r}")
    config = drafter.config
    if getattr(config, "layout", "specdiff") != "dflash":
        raise ValueError(f"only drafters of the dflash layout can be exported (this one is "
                         f"{getattr(config, 'layout', 'specdiff')!r}: it owns its embeddings and head, which the "
                         "engines do not load). Train one with `hf-specdiff train --layout dflash --verifier-layers "
                         "auto ...`.")
    num_target_layers = num_target_layers or config.verifier_num_layers
    if export_format == "dflash" and not num_target_layers:
        raise ValueError("the dflash format records the verifier's layer count: pass num_target_layers")
    fields = transformers_config(config) if export_format == "transformers" else \
        dflash_config(config, num_target_layers)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    dtype_key = "dtype" if export_format == "transformers" else "torch_dtype"  # what each loader reads
    fields[dtype_key] = str(drafter.dtype).removeprefix("torch.")
    (out / "config.json").write_text(json.dumps(fields, indent=2) + "\n")
    save_file(export_state_dict(drafter, export_format), out / "model.safetensors", metadata={"format": "pt"})
    (out / "README.md").write_text(export_card(config, export_format, config.verifier_name_or_path or "the verifier"))
    return out


__all__ = ["EXPORT_FORMATS", "export_drafter", "export_state_dict", "transformers_config", "dflash_config"]
