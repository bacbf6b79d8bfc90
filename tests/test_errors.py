"""Bad input gets an error that names the fix."""

import pytest
import torch

from hf_specdiff import SpecDiffDrafter, check_compatibility
from helpers import tiny_drafter, tiny_verifier

PROMPT = torch.tensor([[5, 9, 14, 3]])


def test_vocab_mismatch():
    verifier = tiny_verifier("llama", vocab_size=96)
    drafter = tiny_drafter(tiny_verifier("llama", vocab_size=128))
    with pytest.raises(ValueError, match="vocab_size \\(128\\) differs from the verifier's \\(96\\)"):
        check_compatibility(verifier, drafter)
    with pytest.raises(ValueError, match="different tokenizers"):  # transformers' own check on the drop-in path
        verifier.generate(PROMPT, max_new_tokens=5, assistant_model=drafter)
    small = tiny_drafter(tiny_verifier("llama", vocab_size=8))
    with pytest.raises(ValueError, match="outside the drafter's vocabulary"):
        small.generate(PROMPT, max_new_tokens=2)


def test_vocab_mismatch_is_caught_on_every_entry_point():
    import hf_specdiff

    verifier = tiny_verifier("llama", vocab_size=96)
    drafter = tiny_drafter(tiny_verifier("llama", vocab_size=128))
    for options in ({}, {"num_drafts": 2}):
        with pytest.raises(ValueError, match="vocab_size \\(128\\) differs from the verifier's \\(96\\)"):
            hf_specdiff.generate(verifier, drafter, PROMPT, max_new_tokens=4, **options)
    with pytest.raises(ValueError, match="vocab_size \\(128\\) differs"):
        drafter.attach(verifier)


def test_cli_prints_its_own_errors_as_one_line_and_others_whole(monkeypatch, capsys):
    import json

    from hf_specdiff.tools import cli

    assert cli.main(["demo", "--drafter", "/nonexistent/drafter"]) == 2
    assert "hf-specdiff demo: error: no drafter folder at /nonexistent/drafter" in capsys.readouterr().err
    monkeypatch.setattr(cli, "cmd_setup", lambda args: json.loads("{"))  # a ValueError from another library
    with pytest.raises(json.JSONDecodeError):
        cli.main(["setup"])


def test_special_token_mismatch():
    verifier = tiny_verifier("llama")
    drafter = tiny_drafter(verifier)
    drafter.config.eos_token_id = 7
    with pytest.raises(ValueError, match="eos_token_id .* differs .*drafter.config.eos_token_id"):
        check_compatibility(verifier, drafter)


def test_draft_longer_than_block():
    verifier = tiny_verifier("llama")
    drafter = tiny_drafter(verifier, block_size=4)
    drafter.generation_config.num_assistant_tokens = 6
    with pytest.raises(ValueError, match="drafts at most 4.*num_assistant_tokens"):
        verifier.generate(PROMPT, max_new_tokens=20, assistant_model=drafter)
    with pytest.raises(ValueError, match="drafts at most 4"):
        drafter.generate(PROMPT, max_new_tokens=5)


def test_batch_and_padding():
    drafter = tiny_drafter(tiny_verifier("llama"))
    with pytest.raises(ValueError, match="one sequence at a time"):
        drafter.generate(PROMPT.repeat(2, 1), max_new_tokens=2)
    with pytest.raises(ValueError, match="padded inputs"):
        drafter.generate(PROMPT, attention_mask=torch.tensor([[0, 1, 1, 1]]), max_new_tokens=2)


def test_checkpoint_of_another_model_type(tmp_path):
    tiny_verifier("llama").save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="is a 'llama' model, not a SpecDiff drafter"):
        SpecDiffDrafter.from_pretrained(tmp_path)


def test_bad_config_values():
    from hf_specdiff import SpecDiffConfig

    with pytest.raises(ValueError, match="unmasking_schedule"):
        SpecDiffConfig(unmasking_schedule="random")
    with pytest.raises(ValueError, match="smaller than max_position_embeddings"):
        SpecDiffConfig(block_size=64, max_position_embeddings=64)


def test_verifier_layer_settings():
    from transformers import LlamaConfig

    from hf_specdiff.compat import verifier_layer_ids

    thirty = LlamaConfig(num_hidden_layers=30)
    assert verifier_layer_ids("auto", thirty) == [1, 14, 28] and verifier_layer_ids("", thirty) == []
    assert verifier_layer_ids("2, 7", thirty) == [2, 7]
    with pytest.raises(ValueError, match="verifier_layers must be empty, 'auto' or a list like '1,14,28', got 'mid'"):
        verifier_layer_ids("mid", thirty)


def test_empty_prompt_is_refused_on_every_entry_point():
    import hf_specdiff

    verifier = tiny_verifier("llama")
    empty = torch.zeros((1, 0), dtype=torch.long)
    standalone, conditioned = tiny_drafter(verifier), tiny_drafter(verifier, conditioned=True)
    with pytest.raises(ValueError, match="The prompt is empty"):
        hf_specdiff.generate(verifier, standalone, empty, max_new_tokens=4)
    with pytest.raises(ValueError, match="The prompt is empty"):
        standalone.generate(empty, max_new_tokens=2)
    try:
        with pytest.raises(ValueError, match="The prompt is empty"):
            verifier.generate(empty, max_new_tokens=4, assistant_model=conditioned.attach(verifier))
    finally:
        conditioned.detach()


def test_conditioned_drafter_and_a_verifier_of_another_width():
    import hf_specdiff
    from transformers import LlamaConfig, LlamaForCausalLM

    verifier = tiny_verifier("llama")
    drafter = tiny_drafter(verifier, conditioned=True)
    narrow = LlamaForCausalLM(LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                          num_attention_heads=4, num_key_value_heads=2)).eval()
    for num_drafts in (1, 4):
        with pytest.raises(ValueError, match="layers of width 32. Use a drafter trained for this verifier"):
            hf_specdiff.generate(narrow, drafter, PROMPT, max_new_tokens=4, num_drafts=num_drafts)
    with pytest.raises(ValueError, match="layers of width 32"):
        narrow.generate(PROMPT, max_new_tokens=4, custom_generate=hf_specdiff.specdiff_generate, drafter=drafter)


def test_broken_drafter_folders_say_what_is_wrong(tmp_path):
    with pytest.raises(FileNotFoundError, match="has no config.json, so it is not a saved SpecDiff drafter"):
        SpecDiffDrafter.from_pretrained(tmp_path)
    tiny_drafter(tiny_verifier("llama")).save_pretrained(tmp_path)
    weights = tmp_path / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="cannot be read .* damaged or incomplete"):
        SpecDiffDrafter.from_pretrained(tmp_path)
    weights.unlink()
    with pytest.raises(FileNotFoundError, match="has a config.json but no weights"):
        SpecDiffDrafter.from_pretrained(tmp_path)
    with pytest.raises(FileNotFoundError, match="is a file: pass the folder"):
        SpecDiffDrafter.from_pretrained(tmp_path / "config.json")


def test_commands_fail_on_bad_files_before_loading_models(tmp_path, capsys):
    from hf_specdiff.tools.cli import main

    # a verifier path that does not exist: had the command loaded it first, it would fail on that instead
    assert main(["bench", "--prompts", str(tmp_path / "missing.jsonl"), "--verifier", str(tmp_path / "nothing")]) == 2
    assert "no prompts file at" in capsys.readouterr().err
    prompts = tmp_path / "question.jsonl"
    prompts.write_text('{"category": "qa", "turns": ["hi"]}\n')
    assert main(["bench", "--prompts", str(prompts), "--top-p", "0.9", "--verifier", str(tmp_path / "nothing")]) == 2
    assert "--top-p and --top-k take effect only when sampling" in capsys.readouterr().err
    assert main(["bench", "--prompts", str(prompts), "--temperature", "-1", "--verifier", str(tmp_path / "x")]) == 2
    assert "--temperature must be >= 0" in capsys.readouterr().err
    verifier = tiny_verifier("llama")
    verifier.config.save_pretrained(tmp_path / "verifier")  # a config without weights: loading it would fail
    tiny_drafter(verifier).save_pretrained(tmp_path / "drafter")
    (tmp_path / "drafter" / "model.safetensors").unlink()
    assert main(["demo", "--drafter", str(tmp_path / "drafter"), "--verifier", str(tmp_path / "verifier")]) == 2
    assert "has a config.json but no weights" in capsys.readouterr().err


def test_cli_folder_arguments_fail_in_one_line_naming_the_fix_before_loading(tmp_path, monkeypatch, capsys):
    from transformers import AutoModelForCausalLM

    from hf_specdiff.tools import cli, verifiers

    def load(*args, **kwargs):
        raise AssertionError("a model loaded before the command checked its folders")

    for owner in (AutoModelForCausalLM, SpecDiffDrafter):
        monkeypatch.setattr(owner, "from_pretrained", load)
    monkeypatch.setattr(verifiers, "load_verifier", load)
    missing, empty, out = tmp_path / "missing", tmp_path / "empty", str(tmp_path / "out")
    empty.mkdir()
    prompts = tmp_path / "question.jsonl"
    prompts.write_text('{"category": "qa", "turns": ["hi"]}\n')
    trained = "pass the folder that `hf-specdiff train --out`"
    cases = [  # (arguments, the error up to its fix, a part of the fix)
        (["bench", "--prompts", str(prompts), "--drafter", str(missing)],
         f"no drafter folder at {missing} (no such folder)", "or leave --drafter out for the shipped drafter"),
        (["eval-drafter", "--verifier", "smollm2-135m-instruct", "--drafter", str(empty), "--prompts", str(prompts)],
         f"no drafter folder at {empty} (it has no config.json)", trained),
        (["export", str(missing), out, "--format", "dflash"], f"no drafter folder at {missing} (no such folder)",
         "dflash-layout drafter, as `hf-specdiff train --layout dflash"),
        (["package", str(missing), out], f"no drafter folder at {missing} (no such folder)", trained),
        (["card", str(missing)], f"no drafter folder at {missing} (no such folder)", "`hf-specdiff package` wrote"),
        (["distill-data", "--verifier", "smollm3", "--prompts", str(prompts), "--out", out],
         "no verifier folder at smollm3 (no such folder)",
         "pass a known verifier name (gemma-3-270m, smollm2-135m-instruct) or a model folder with a config.json"),
        (["train", "--verifier", "smollm2-135m-instruct", "--data", str(empty), "--out", out],
         f"no distillation data folder at {empty} (it has no meta.json)", "`hf-specdiff distill-data --out`"),
    ]
    for argv, problem, fix in cases:
        assert cli.main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith(f"hf-specdiff {argv[0]}: error: {problem}: ") and fix in err and err.count("\n") == 1, err
