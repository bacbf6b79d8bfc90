"""Whole training runs: objectives and drafter kinds compared on held-out prompts, exact resume after a kill, and
several processes training as one."""

import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import psutil
import pytest
import torch
from safetensors.torch import load_file

from hf_specdiff.training.data import read_prompts
from hf_specdiff.training.evaluate import evaluate_drafter
from hf_specdiff.modeling_specdiff import SpecDiffDrafter
from hf_specdiff.training.trainer import TrainConfig, train
from training_workspace import base_config, workspace  # noqa: F401 (fixture)

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_streak_beats_mdlm_on_held_out_prompts(workspace):
    """Streak distillation (its ce-streak form, which trains from scratch) against the MDLM objective."""
    root, verifier, tokenizer = workspace
    eval_prompts = read_prompts(root / "eval.jsonl")
    taus = {}
    for objective in ("ce-streak", "mdlm"):
        out = train(base_config(root, f"drafter-{objective}", objective=objective), progress=False)
        drafter = SpecDiffDrafter.from_pretrained(out).eval()
        report = evaluate_drafter(verifier, tokenizer, drafter, eval_prompts, draft_length=8, max_new_tokens=40,
                                  progress=False)
        taus[objective] = report["tau"]
        log = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
        assert "acceptance_by_position" in log[-1] and log[-1]["step"] == 200
        recipe = json.loads((out / "training_recipe.json").read_text())
        assert recipe["steps"] == 200 and recipe["config"]["objective"] == objective
    assert taus["ce-streak"] > taus["mdlm"] > 1.2, taus


@pytest.mark.slow
def test_conditioned_drafter_beats_standalone_on_held_out_prompts(workspace):
    """Equal steps and data: reading the verifier's hidden states gives a higher held-out tau than tokens alone."""
    root, verifier, tokenizer = workspace
    eval_prompts = read_prompts(root / "eval.jsonl")
    taus = {}
    for name, layers in (("standalone", ""), ("conditioned", "auto")):
        out = train(base_config(root, f"kind-{name}", verifier_layers=layers), progress=False)
        drafter = SpecDiffDrafter.from_pretrained(out).eval()
        assert drafter.config.is_conditioned == bool(layers)
        log = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
        assert log[-1]["greedy_streak"] > 0  # held-out metrics ran for both kinds
        report = evaluate_drafter(verifier, tokenizer, drafter, eval_prompts, draft_length=8, max_new_tokens=40,
                                  progress=False)
        taus[name] = report["tau"]
    assert taus["conditioned"] > taus["standalone"] > 1.2, taus


@pytest.mark.slow
def test_killed_training_resumes_to_the_same_weights(workspace, monkeypatch):
    root, _, _ = workspace
    loads = []  # the trainer state must load without unpickling arbitrary objects
    monkeypatch.setattr(torch, "load", lambda *a, load=torch.load, **k: loads.append(k.get("weights_only")) or
                        load(*a, **k))
    whole = train(base_config(root, "whole", max_steps=120, save_every=20), progress=False)
    config = base_config(root, "killed", max_steps=120, save_every=20)
    args = [sys.executable, "-m", "hf_specdiff.training", *_flags(config)]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": str(torch.get_num_threads())}  # as in-process
    step, _ = _kill_after_checkpoint(args, env, Path(config.out), 40)
    assert 40 <= step < 120, "the run was not killed mid-way"
    assert not (Path(config.out) / "model.safetensors").exists()
    killed_seconds = json.loads((Path(config.out) / "checkpoint" / "state.json").read_text())["wall_time_s"]
    resumed = train(config, progress=False)
    assert loads and all(loads), loads
    a, b = load_file(whole / "model.safetensors"), load_file(resumed / "model.safetensors")
    assert a.keys() == b.keys()
    differ = {k: (a[k] - b[k]).abs().max().item() for k in a if not torch.equal(a[k], b[k])}
    assert not differ, f"resumed from step {step}, the weights differ (max abs difference): {differ}"
    recipe = json.loads((resumed / "training_recipe.json").read_text())  # the wall time counts both sessions
    assert recipe["resumed_from_step"] == step and recipe["wall_time_s"] > killed_seconds > 0, recipe
    finished = {f: (resumed / f).read_bytes() for f in ("training_recipe.json", "model.safetensors", "log.jsonl")}
    monkeypatch.setattr("hf_specdiff.tools.verifiers.load_verifier",  # and returns at once, loading nothing
                        lambda *a, **k: pytest.fail("a finished run loaded its verifier"))
    train(config, progress=False)  # a finished run started again is left as it is
    assert all((resumed / f).read_bytes() == data for f, data in finished.items())


def _kill_after_checkpoint(command: list[str], env: dict, out: Path, step: int) -> tuple[int, int]:
    """Start a training `command`, SIGKILL it and every process it started once `out` holds a checkpoint of `step`
    or later; return the step of the checkpoint left behind and how many training processes it had started."""
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    state = out / "checkpoint" / "state.json"
    deadline = time.time() + 300
    while time.time() < deadline and process.poll() is None:
        if state.exists() and json.loads(state.read_text())["step"] >= step:
            break
        time.sleep(0.02)
    launcher = psutil.Process(process.pid)
    children = launcher.children(recursive=True)  # torchrun gives its workers their own sessions
    trainers = sum("hf_specdiff.training" in " ".join(_command_line(child)) for child in children)
    for each in [*children, launcher]:
        each.kill()
    process.wait()
    psutil.wait_procs([*children, launcher], timeout=10)
    return json.loads(state.read_text())["step"], trainers


def _command_line(process) -> list[str]:
    try:
        return process.cmdline()
    except psutil.Error:
        return []


def _flags(config: TrainConfig) -> list[str]:
    return [arg for key, value in vars(config).items() for arg in (f"--{key.replace('_', '-')}", str(value))]


def _losses(out: Path) -> dict[int, float]:
    """The logged loss at each step; a resumed run logs the steps after its checkpoint again: the last one counts."""
    records = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in records if "loss" in r}


@pytest.mark.slow
def test_two_processes_train_as_one_and_a_killed_run_resumes_in_one(workspace):
    """Two CPU processes (`accelerate launch --multi_gpu --num_processes 2`, torchrun underneath; accelerate's `--cpu`
    launches one process unless it has mpirun): each trains on its half of the same global batch, so the run follows
    the single-process one (up to the rounding of the gradient all-reduce); killed, it resumes in one process."""
    root, _, _ = workspace
    one = base_config(root, "one-process", max_steps=80, save_every=10, log_every=1, eval_every=80)
    train(one, progress=False)
    two = replace(one, out=str(root / "two-processes"))
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
              "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port",
              "29517", "-m", "hf_specdiff.training", *_flags(two)]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    killed_at, workers = _kill_after_checkpoint(launch, env, Path(two.out), 30)
    assert 30 <= killed_at < 80 and workers == 2, f"killed at step {killed_at} with {workers} workers"
    assert not (Path(two.out) / "model.safetensors").exists()
    train(two, progress=False)  # the batch is global: the run resumes in any number of processes
    recipe = json.loads((Path(two.out) / "training_recipe.json").read_text())
    assert recipe["resumed_from_step"] == killed_at
    a, b = _losses(Path(one.out)), _losses(Path(two.out))
    assert a.keys() == b.keys() == set(range(1, 81))
    differ = max(abs(a[k] - b[k]) / a[k] for k in a)
    assert differ < 1e-4, f"the 2-process losses differ from the 1-process ones by up to {differ:.2e}"  # seen: 5e-6
    assert a[80] < 0.8 * a[1]  # and it learned
