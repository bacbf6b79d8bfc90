"""hf_specdiff: speculative decoding with discrete-diffusion drafters for Hugging Face transformers.

`import hf_specdiff` registers the `specdiff` model type with the Auto classes, so
`AutoModelForCausalLM.from_pretrained(drafter_dir)` uses this installed code.
"""

from transformers import AutoConfig, AutoModelForCausalLM

from .compat import check_compatibility
from .configuration_specdiff import SpecDiffConfig
from .decoding import SpecDiffStats, generate, specdiff_generate
from .generation_specdiff import SpecDiffCache
from .tools.hub import export_custom_generate
from .modeling_specdiff import SpecDiffDrafter, SpecDiffModel
from .tools.shipped import shipped_drafter_path

__version__ = "0.1.0"

AutoConfig.register("specdiff", SpecDiffConfig, exist_ok=True)
AutoModelForCausalLM.register(SpecDiffConfig, SpecDiffDrafter, exist_ok=True)
# save_pretrained writes `auto_map` and copies the modelling files, so saved folders load with trust_remote_code.
SpecDiffConfig.register_for_auto_class()
SpecDiffDrafter.register_for_auto_class("AutoModelForCausalLM")

__all__ = [
    "SpecDiffConfig",
    "SpecDiffDrafter",
    "SpecDiffModel",
    "SpecDiffCache",
    "SpecDiffStats",
    "check_compatibility",
    "export_custom_generate",
    "generate",
    "shipped_drafter_path",
    "specdiff_generate",
]
