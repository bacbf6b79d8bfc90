"""The machine's cost profile: measured once, cached per machine and models, read by `hf-specdiff doctor`, the
demo and `--dtype auto`."""

import json
import os
import re
from pathlib import Path

import pytest
import torch

import hf_specdiff.costs_specdiff as costs_specdiff
from hf_specdiff.tools.doctor import Outlook, fastest, report
from hf_specdiff.costs_specdiff import PROFILE_LENGTHS, CostProfile, cost_profile
from helpers import tiny_drafter, tiny_tokenizer, tiny_verifier

# a verified token costs two plain steps; a drafter call half of one
DEAR_TOKENS = CostProfile({1: 1.0, 2: 3.0, 3: 5.0}, {1: 0.5, 8: 0.5})
# verifying 8 tokens costs 1.2 plain steps (an AVX512-BF16 CPU, a GPU)
CHEAP_TOKENS = CostProfile({1: 1.0, 2: 1.05, 4: 1.1, 8: 1.2, 16: 1.6}, {1: 0.1, 8: 0.1})


@pytest.fixture
def saved_models(tmp_path):
    verifier = tiny_verifier("llama")
    verifier.save_pretrained(tmp_path / "verifier")
    tiny_tokenizer().save_pretrained(tmp_path / "verifier")
    tiny_drafter(verifier, block_size=8).save_pretrained(tmp_path / "drafter")
    return tmp_path


def test_cost_profile_is_measured_once_per_machine_and_models_then_read_from_disk(monkeypatch):
    verifier = tiny_verifier("llama")
    drafter = tiny_drafter(verifier, block_size=8)
    profile = cost_profile(verifier, drafter)
    assert sorted(profile.verifier) == list(PROFILE_LENGTHS) and sorted(profile.drafter) == [1, 8]
    assert all(seconds > 0 for seconds in [*profile.verifier.values(), *profile.drafter.values()])
    assert profile.machine["threads"] == torch.get_num_threads()
    directory = Path(costs_specdiff.cost_profile_dir())
    files = os.listdir(directory)
    assert any(CostProfile.from_dict(json.loads((directory / name).read_text())) == profile for name in files)

    monkeypatch.setattr(costs_specdiff, "_PROFILES", {})  # a new process: only the disk remembers
    monkeypatch.setattr(costs_specdiff, "measure_costs", lambda *a, **k: pytest.fail("measured again"))
    assert cost_profile(verifier, drafter) == profile
    verifier.to(torch.float64)  # another dtype: another profile
    assert cost_profile(verifier, drafter, measure=False) is None
    with pytest.raises(pytest.fail.Exception, match="measured again"):
        cost_profile(verifier, drafter)


def test_a_profile_keeps_each_forwards_fastest_time_so_a_passing_load_does_not_stay_in_it(monkeypatch):
    """Other work on the machine only adds time: a load that slows 3 of each forward's 5 timings (a median would keep
    it) leaves the profile at what the forwards cost on the machine alone."""
    verifier = tiny_verifier("llama")
    clock, forwards = [0.0], []

    def timed_forward(module, args, kwargs, output):
        forwards.append(kwargs["input_ids"].shape[1])
        timed_pass = (len(forwards) - 2) // len(PROFILE_LENGTHS)  # after the context's forward, an untimed pass
        loaded = timed_pass in (1, 2, 3)  # 3 of the 5 timed passes run beside other work
        clock[0] += (1.0 + 0.01 * forwards[-1]) * (3.0 if loaded else 1.0)

    verifier.register_forward_hook(timed_forward, with_kwargs=True)
    monkeypatch.setattr(costs_specdiff, "device_clock", lambda device: clock[0])
    profile = costs_specdiff.measure_costs(verifier)
    assert profile.verifier == pytest.approx({n: 1.0 + 0.01 * n for n in PROFILE_LENGTHS})


def test_outlook_says_where_drafting_pays():
    dear, cheap = Outlook("bf16", DEAR_TOKENS, 8), Outlook("fp32", CHEAP_TOKENS, 8)
    assert dear.best(0.9)[0] == 0 and dear.speedup(0.9) == pytest.approx(1.0)  # even a perfect drafter cannot pay
    assert dear.break_even() is None and dear.break_even(drafted=False) is None
    assert cheap.best(0.5)[0] >= 1 and cheap.speedup(0.9) > 3 and cheap.break_even() < 0.2
    assert cheap.best(0.9, drafted=False)[1] > cheap.best(0.9)[1]  # a lookup draft pays no drafter call
    assert fastest([dear, cheap]) is cheap
    text = report([dear, cheap])
    assert "bf16: from the first round, plain steps" in text
    assert f"fp32: from the first round, the drafter drafts {cheap.best(0.5)[0]} tokens" in text
    assert "--dtype auto picks fp32" in text


def test_doctor_command_prints_the_profile_of_both_dtypes(saved_models, capsys):
    from hf_specdiff.tools.cli import main

    assert main(["doctor", "--verifier", str(saved_models / "verifier"), "--drafter", str(saved_models / "drafter"),
                 "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert "1 threads" in out and "--dtype auto picks" in out
    assert all(re.search(rf"{dtype} +{source}", out) for dtype in ("bf16", "fp32") for source in ("drafter", "prompt"))
    assert main(["doctor", "--drafter", str(saved_models / "missing")]) == 2
    assert "no drafter folder at" in capsys.readouterr().err


def test_demo_picks_a_dtype_runs_its_default_prompts_and_says_what_the_machine_allows(saved_models, capsys):
    from hf_specdiff.tools.demo import DEMO_PROMPTS, run_demo

    results = run_demo(verifier=str(saved_models / "verifier"), drafter=str(saved_models / "drafter"),
                       max_new_tokens=6, threads=1, colour=False)
    out = capsys.readouterr().out
    assert len(results) == len(DEMO_PROMPTS) == out.count("\n> ")
    assert "--dtype auto: " in out and f"total ({len(DEMO_PROMPTS)} prompts)" in out
    assert "this machine (" in out and "a prompt-lookup token" in out


def test_a_drafter_that_drafts_with_the_verifiers_weights_is_paired_before_its_profile_is_measured():
    from helpers import tiny_dflash_drafter

    verifier = tiny_verifier("qwen3")
    drafter = tiny_dflash_drafter(verifier)  # not paired: it cannot draft without the verifier's embeddings and head
    profile = drafter.cost_profile(verifier)
    assert sorted(profile.drafter) == sorted({1, drafter.config.max_draft_tokens}) and drafter.cost_profile() == profile


def test_auto_dtype_loads_each_dtype_once_and_keeps_the_fastest(tmp_path, monkeypatch, capsys):
    import hf_specdiff.tools.doctor as doctor
    from hf_specdiff import SpecDiffDrafter
    from hf_specdiff.tools.doctor import load_fastest

    verifier = tiny_verifier("llama")
    verifier.save_pretrained(tmp_path / "verifier")
    tiny_tokenizer().save_pretrained(tmp_path / "verifier")
    tiny_drafter(verifier, block_size=8).save_pretrained(tmp_path / "drafter")
    loads, load_pair = [], doctor.load_pair
    monkeypatch.setattr(doctor, "load_pair", lambda *args, **kwargs: loads.append(args[2]) or load_pair(*args, **kwargs))
    profiles = {torch.bfloat16: DEAR_TOKENS, torch.float32: CHEAP_TOKENS}  # drafting pays in fp32 only
    monkeypatch.setattr(SpecDiffDrafter, "cost_profile", lambda drafter, model: profiles[model.dtype])
    model, tokenizer, drafter = load_fastest(str(tmp_path / "verifier"), str(tmp_path / "drafter"), threads=1)
    assert loads == [torch.bfloat16, torch.float32]
    assert model.dtype == drafter.dtype == torch.float32 and tokenizer is not None
    assert "--dtype auto: fp32" in capsys.readouterr().out
