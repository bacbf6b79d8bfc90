"""Saving, remote-code loading, Auto-class registration and pipelines."""

import json
import subprocess
import sys
import textwrap

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, pipeline

import hf_specdiff
from hf_specdiff.tools.hub import REMOTE_CODE_FILES
from helpers import greedy_sequences, run_as_remote_code, tiny_drafter, tiny_tokenizer, tiny_verifier, train_briefly

INPUT = torch.tensor([[5, 9, 14, 3, 3, 70, 12]])


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    verifier = tiny_verifier("llama")
    drafter = tiny_drafter(verifier, block_size=8, num_denoising_steps=2)
    path = tmp_path_factory.mktemp("drafter")
    drafter.save_pretrained(path)
    return drafter, path


def test_saved_folder_is_hub_ready(saved):
    _, path = saved
    config = json.loads((path / "config.json").read_text())
    assert config["auto_map"] == {"AutoConfig": "configuration_specdiff.SpecDiffConfig",
                                  "AutoModelForCausalLM": "modeling_specdiff.SpecDiffDrafter"}
    for name in (*REMOTE_CODE_FILES, "model.safetensors"):
        assert (path / name).exists(), name
    generation = json.loads((path / "generation_config.json").read_text())
    assert generation["num_assistant_tokens"] == 8
    assert generation["assistant_confidence_threshold"] == 0.0
    for name in REMOTE_CODE_FILES:
        imports = [line for line in (path / name).read_text().splitlines() if line.startswith(("import ", "from "))]
        assert all(line.split()[1].split(".")[0] in {"torch", "transformers", ""} | sys.stdlib_module_names
                   for line in imports), imports


@pytest.mark.slow
def test_fresh_process_loads_with_trust_remote_code(saved, tmp_path):
    drafter, path = saved
    with torch.no_grad():
        expected = drafter(INPUT).logits
        expected_draft = drafter.generate(INPUT, max_new_tokens=8).sequences
    script = textwrap.dedent(f"""
        import sys, torch
        sys.modules["hf_specdiff"] = None  # the package must not be importable
        from transformers import AutoModelForCausalLM
        model = AutoModelForCausalLM.from_pretrained({str(path)!r}, trust_remote_code=True).eval()
        assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
        inputs = torch.tensor({INPUT.tolist()})
        with torch.no_grad():
            torch.save({{"logits": model(inputs).logits,
                        "draft": model.generate(inputs, max_new_tokens=8).sequences}}, {str(tmp_path / "out.pt")!r})
    """)
    subprocess.run([sys.executable, "-c", script], check=True, cwd=tmp_path)
    got = torch.load(tmp_path / "out.pt")
    assert torch.equal(got["logits"], expected)
    assert torch.equal(got["draft"], expected_draft)


@pytest.mark.slow
def test_conditioned_drafter_attaches_from_remote_code(tmp_path):
    """A conditioned drafter loaded as remote code (no hf_specdiff) drafts through `assistant_model=drafter.attach`."""
    verifier = tiny_verifier("llama")
    drafter = tiny_drafter(verifier, block_size=8, conditioned=True)
    train_briefly(drafter, greedy_sequences(verifier, torch.randint(3, 96, (8, 6)), 30), steps=60, verifier=verifier)
    run_as_remote_code(tmp_path, verifier, drafter, f"""
        kwargs = dict(max_new_tokens=24, do_sample=False, eos_token_id=None)
        plain = verifier.generate(torch.tensor({INPUT.tolist()}), **kwargs)
        calls = []
        drafter.register_forward_pre_hook(lambda *_: calls.append(1))
        fast = verifier.generate(torch.tensor({INPUT.tolist()}), assistant_model=drafter.attach(verifier), **kwargs)
        drafter.detach()
        assert fast.tolist() == plain.tolist() and len(calls) > 1, (fast, plain, calls)
    """)


def test_import_registers_auto_classes(saved):
    drafter, path = saved
    loaded = AutoModelForCausalLM.from_pretrained(path)  # no trust_remote_code: the installed code is used
    assert type(loaded) is hf_specdiff.SpecDiffDrafter
    with torch.no_grad():
        assert torch.equal(loaded.eval()(INPUT).logits, drafter(INPUT).logits)
    default = AutoConfig.for_model("specdiff")
    assert default.model_type == "specdiff" and default.mask_token_index == default.vocab_size
    model = AutoModelForCausalLM.from_config(default)
    assert model(torch.tensor([[1, 2, 3]])).logits.shape == (1, 3, default.vocab_size)


def test_pipeline_with_assistant_equals_plain_pipeline():
    verifier = tiny_verifier("llama")
    tokenizer = tiny_tokenizer()
    drafter = train_briefly(tiny_drafter(verifier, block_size=8),
                            greedy_sequences(verifier, torch.randint(3, 96, (8, 5)), 40), steps=60)
    prompt = "t5 t9 t14 t33 t70"
    plain = pipeline("text-generation", model=verifier, tokenizer=tokenizer)
    assisted = pipeline("text-generation", model=verifier, tokenizer=tokenizer, assistant_model=drafter)
    kwargs = dict(max_new_tokens=30, do_sample=False)
    assert assisted(prompt, **kwargs)[0]["generated_text"] == plain(prompt, **kwargs)[0]["generated_text"]


@pytest.mark.parametrize("name", ["specdiff-smollm2-135m-instruct", "specdiff-dflash-smollm2-135m-instruct"])
def test_shipped_drafter_folder_carries_current_code_and_loads(name):
    from pathlib import Path

    from hf_specdiff.tools.hub import validate_model_folder

    folder = Path(__file__).resolve().parents[1] / "model_cards" / name
    package = Path(hf_specdiff.__file__).parent
    for file in REMOTE_CODE_FILES:
        assert (folder / file).read_text() == (package / file).read_text(), \
            f"{file} is stale: re-save the drafter (SpecDiffDrafter.from_pretrained(folder).save_pretrained(folder))"
    assert validate_model_folder(folder) == []
    drafter = AutoModelForCausalLM.from_pretrained(folder)
    assert drafter.config.vocab_size == 49152 and drafter.config.eos_token_id == 2


def test_package_writes_a_trained_drafter_as_a_hub_folder_in_bf16(tmp_path, capsys):
    from safetensors.torch import load_file

    from hf_specdiff.tools.cli import main as cli

    drafter = tiny_drafter(tiny_verifier("llama"))
    drafter.save_pretrained(tmp_path / "run")
    (tmp_path / "run" / "training_recipe.json").write_text('{"steps": 3}')
    assert cli(["package", str(tmp_path / "run"), str(tmp_path / "card")]) == 0
    saved, packaged = load_file(tmp_path / "run" / "model.safetensors"), load_file(tmp_path / "card" / "model.safetensors")
    assert packaged.keys() == saved.keys()
    assert all(packaged[k].dtype == torch.bfloat16 and torch.equal(packaged[k], saved[k].bfloat16()) for k in saved)
    assert json.loads((tmp_path / "card" / "training_recipe.json").read_text()) == {"steps": 3}
    assert all((tmp_path / "card" / f).is_file() for f in REMOTE_CODE_FILES)
    assert AutoModelForCausalLM.from_pretrained(tmp_path / "card").dtype == torch.bfloat16
    assert cli(["package", str(tmp_path / "run"), str(tmp_path / "run")]) == 2
    assert "is the drafter's own folder" in capsys.readouterr().err
    assert cli(["package", str(tmp_path / "none"), str(tmp_path / "card2")]) == 2
    assert "no drafter folder at" in capsys.readouterr().err
