"""Exports of a dflash-layout drafter: transformers' own DFlash model (no remote code) and z-lab's layout."""

import json
import subprocess
import sys
import textwrap

import pytest
import torch
from safetensors.torch import load_file

from hf_specdiff.tools.cli import main as cli
from hf_specdiff.decoding import TreeDecoding
from hf_specdiff.tools.export import _RENAMES, export_drafter
from hf_specdiff.modeling_specdiff import SpecDiffDrafter
from helpers import DFLASH_PROMPTS, tiny_drafter, tiny_verifier, trained_dflash

PROMPTS = DFLASH_PROMPTS

# What the engines load, written from their loaders (read 2026-12): z-lab/dflash dflash/model.py @ 44947fb (module
# names); vLLM vllm/model_executor/models/qwen3_dflash.py @ 036a00d (load_weights adds the "model." prefix itself and
# stacks q/k/v and gate/up from these names); SGLang python/sglang/srt/models/dflash.py @ 003b23d (load_weights:
# unmatched names are silently skipped, so a wrong name gives a drafter that accepts nothing).
DFLASH_LAYER_KEYS = ("input_layernorm.weight", "post_attention_layernorm.weight", "self_attn.q_proj.weight",
                     "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight",
                     "self_attn.q_norm.weight", "self_attn.k_norm.weight", "mlp.gate_proj.weight",
                     "mlp.up_proj.weight", "mlp.down_proj.weight")
DFLASH_KEYS_2_LAYERS = {"fc.weight", "hidden_norm.weight", "norm.weight",
                        *(f"layers.{i}.{name}" for i in range(2) for name in DFLASH_LAYER_KEYS)}
# Config fields those loaders read (vLLM's registry maps architectures "DFlashDraftModel"; it builds the config with
# AutoConfig.for_model(model_type); z-lab reads block_size and num_target_layers at the top level; vLLM requires
# dflash_config.mask_token_id; full attention avoids vLLM's and SGLang's causal sliding-window layers).
DFLASH_CONFIG_FIELDS = {"architectures", "model_type", "hidden_size", "num_hidden_layers", "num_attention_heads",
                        "num_key_value_heads", "head_dim", "intermediate_size", "hidden_act", "rms_norm_eps",
                        "attention_bias", "rope_theta", "max_position_embeddings", "vocab_size", "block_size",
                        "num_target_layers", "dflash_config", "layer_types"}


@pytest.fixture(scope="module")
def trained():
    return trained_dflash


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_transformers_export_runs_without_hf_specdiff(trained, arch, tmp_path):
    """In a process that never imports hf_specdiff, the export loads with AutoModel and, through transformers'
    DFlash loop, gives plain greedy's tokens and the drafts our own K=1 loop gives."""
    verifier, drafter = trained(arch)
    verifier.save_pretrained(tmp_path / "verifier")
    drafter.save_pretrained(tmp_path / "drafter")
    assert cli(["export", str(tmp_path / "drafter"), str(tmp_path / "out"), "--format", "transformers"]) == 0
    card = (tmp_path / "out" / "README.md").read_text()
    assert "speculative-decoding" in card and "dflash" in card and "must be used with" in card
    ours = []
    original = TreeDecoding.draft_tree

    def record(self, input_ids, cache):
        round_ = original(self, input_ids, cache)
        if len(round_.drafts) == 1 and len(round_.drafts[0]) == drafter.config.max_draft_tokens:
            ours.append([input_ids.shape[1], list(round_.drafts[0])])
        return round_

    TreeDecoding.draft_tree = record
    try:
        from hf_specdiff import generate
        for prompt in PROMPTS[:3].split(1):
            generate(verifier, drafter, prompt, max_new_tokens=40, do_sample=False, eos_token_id=None,
                     draft_length=drafter.config.max_draft_tokens)
    finally:
        TreeDecoding.draft_tree = original
    assert len(ours) >= 4
    script = textwrap.dedent(f"""
        import json, sys, torch
        sys.modules["hf_specdiff"] = None
        from transformers import AutoModel, AutoModelForCausalLM
        from transformers.generation.candidate_generator import DFlashTokenCandidateGenerator as G
        verifier = AutoModelForCausalLM.from_pretrained({str(tmp_path / "verifier")!r}).eval()
        drafter = AutoModel.from_pretrained({str(tmp_path / "out")!r}).eval()
        assert type(drafter).__name__ == "MuseGlimmerAssistantModel", type(drafter)
        theirs, original = [], G.get_candidates
        def record(self, input_ids, *args, **kwargs):
            candidates, logits = original(self, input_ids, *args, **kwargs)
            if candidates.shape[1] > input_ids.shape[1]:
                theirs.append([input_ids.shape[1], candidates[0, input_ids.shape[1]:].tolist()])
            return candidates, logits
        G.get_candidates = record
        for prompt in torch.tensor({PROMPTS[:3].tolist()}).split(1):
            kwargs = dict(max_new_tokens=40, do_sample=False, eos_token_id=None)
            plain = verifier.generate(prompt, **kwargs)
            fast = verifier.generate(prompt, assistant_model=drafter, speculation_type="dflash", **kwargs)
            assert fast.tolist() == plain.tolist()
        print(json.dumps(theirs))
    """)
    run = subprocess.run([sys.executable, "-c", script], check=True, cwd=tmp_path, capture_output=True, text=True)
    theirs = json.loads(run.stdout.strip().splitlines()[-1])
    assert all(round_ in theirs for round_ in ours), (ours, theirs)


def test_dflash_export_has_the_engines_names_and_loads_back(trained, tmp_path):
    verifier, drafter = trained("qwen3")
    export_drafter(drafter, tmp_path / "out", "dflash")
    weights = load_file(tmp_path / "out" / "model.safetensors")
    assert set(weights) == DFLASH_KEYS_2_LAYERS
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert DFLASH_CONFIG_FIELDS <= set(config)
    assert config["architectures"] == ["DFlashDraftModel"] and config["model_type"] == "qwen3"
    assert config["dflash_config"]["mask_token_id"] == drafter.config.mask_token_id
    assert config["dflash_config"]["target_layer_ids"] == drafter.config.target_layer_ids
    assert max(config["dflash_config"]["target_layer_ids"]) <= config["num_target_layers"] - 2
    assert config["vocab_size"] == verifier.config.vocab_size and config["block_size"] == drafter.config.block_size
    assert weights["fc.weight"].shape == (64, 64 * len(drafter.config.target_layer_ids))
    # loaded back into our drafter (names mapped back), the logits are the same
    back = {ours + name[len(theirs):]: tensor for name, tensor in weights.items()
            for ours, theirs in _RENAMES["dflash"].items() if name.startswith(theirs)}
    again = SpecDiffDrafter(drafter.config).eval().set_verifier(verifier)
    again.load_state_dict(back)
    features = torch.randn(1, 5, 64 * len(drafter.config.target_layer_ids))
    ids = torch.tensor([[7] + [drafter.config.mask_token_id] * 7])
    assert torch.equal(again(ids, verifier_features=features).logits, drafter(ids, verifier_features=features).logits)


def test_export_refuses_other_drafters(tmp_path, capsys):
    verifier = tiny_verifier("llama")
    tiny_drafter(verifier, conditioned=True).save_pretrained(tmp_path / "own")
    assert cli(["export", str(tmp_path / "own"), str(tmp_path / "out"), "--format", "dflash"]) == 2
    assert "only drafters of the dflash layout can be exported" in capsys.readouterr().err
