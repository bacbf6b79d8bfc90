"""Data generation, the trainer (objectives compared, exact resume after a kill) and drafter evaluation."""

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

from hf_specdiff.cli import main as cli
from hf_specdiff.data import DistillDataConfig, load_distill_data, make_distill_data, read_prompts
from hf_specdiff.evaluate import evaluate_drafter
from hf_specdiff.hub import render_card
from hf_specdiff.modeling_specdiff import SpecDiffDrafter
from hf_specdiff.training import TrainConfig, train
from helpers import tiny_tokenizer, tiny_verifier

REPO = Path(__file__).resolve().parents[1]


def counting_verifier(seed=0):
    """A tiny verifier that mostly counts up (head = embeddings shifted by one), with some noise: a process that
    generalises to new prompts, so held-out tau measures learning, not memory."""
    verifier = tiny_verifier("llama", seed=seed)
    with torch.no_grad():
        verifier.lm_head.weight.copy_(torch.roll(verifier.model.embed_tokens.weight, 1, 0) * 6)
    return verifier


def write_prompts(path: Path, count: int, seed: int) -> Path:
    generator = torch.Generator().manual_seed(seed)
    with path.open("w") as f:
        for _ in range(count):
            words = torch.randint(4, 96, (6,), generator=generator).tolist()
            f.write(json.dumps({"prompt": " ".join(f"t{w}" for w in words)}) + "\n")
    return path


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    root = tmp_path_factory.mktemp("train")
    verifier, tokenizer = counting_verifier(), tiny_tokenizer()
    verifier.save_pretrained(root / "verifier")
    tokenizer.save_pretrained(root / "verifier")
    write_prompts(root / "train.jsonl", 48, seed=0)
    write_prompts(root / "eval.jsonl", 8, seed=1)
    config = DistillDataConfig(samples_per_prompt=2, temperature=0.7, max_new_tokens=48)
    make_distill_data(verifier, tokenizer, read_prompts(root / "train.jsonl"), root / "data", config, batch_size=16,
                      progress=False)
    return root, verifier, tokenizer


def base_config(root: Path, out: str, **overrides) -> TrainConfig:
    config = TrainConfig(verifier=str(root / "verifier"), data=str(root / "data"), out=str(root / out),
                         hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                         block_size=8, seq_len=48, batch_size=8, lr=3e-3, warmup_steps=10, max_steps=200,
                         save_every=50, eval_every=100, log_every=10, eval_fraction=0.1)
    return replace(config, **overrides)


def test_distill_data_rows(workspace):
    root, verifier, tokenizer = workspace
    meta, rows = load_distill_data(root / "data")
    assert len(rows) == 96 and meta["settings"]["samples_per_prompt"] == 2
    assert {(r["prompt_index"], r["sample_index"]) for r in rows} == {(i, s) for i in range(48) for s in range(2)}
    assert all(0 < len(r["response_ids"]) <= 48 for r in rows)


def test_distill_data_resumes_after_a_crash(workspace, tmp_path):
    root, verifier, tokenizer = workspace
    prompts = read_prompts(root / "train.jsonl")
    config = DistillDataConfig(samples_per_prompt=2, temperature=0.7, max_new_tokens=48)
    make_distill_data(verifier, tokenizer, prompts[:20], tmp_path / "full", config, batch_size=8, progress=False)
    # A killed run: the first 3 of 5 batches written, the third cut mid-line.
    crashed = tmp_path / "crashed"
    make_distill_data(verifier, tokenizer, prompts[:20], crashed, config, batch_size=8, progress=False)
    shard = crashed / "data-00000.jsonl"
    lines = shard.read_bytes().splitlines(keepends=True)
    shard.write_bytes(b"".join(lines[:19]) + lines[19][:25])
    make_distill_data(verifier, tokenizer, prompts[:20], crashed, config, batch_size=8, progress=False)
    _, full = load_distill_data(tmp_path / "full")
    _, resumed = load_distill_data(crashed)
    partial = tmp_path / "partial"  # a smaller data set, then extended: the same rows as one full run
    make_distill_data(verifier, tokenizer, prompts[:20], partial, config, batch_size=8, progress=False, max_samples=16)
    assert len(load_distill_data(partial)[1]) == 16
    make_distill_data(verifier, tokenizer, prompts[:20], partial, config, batch_size=8, progress=False)
    key_ = lambda r: (r["prompt_index"], r["sample_index"])  # noqa: E731
    assert sorted(load_distill_data(partial)[1], key=key_) == sorted(full, key=key_)
    key = lambda r: (r["prompt_index"], r["sample_index"])  # noqa: E731
    assert len(resumed) == len(full) == 40
    assert sorted(resumed, key=key) == sorted(full, key=key)  # nothing lost, nothing twice, same samples


def test_greedy_distill_data_is_the_verifiers_greedy_response(workspace, tmp_path):
    root, verifier, tokenizer = workspace
    prompts = read_prompts(root / "train.jsonl")[:6]
    config = DistillDataConfig(samples_per_prompt=1, temperature=0.0, max_new_tokens=24)
    make_distill_data(verifier, tokenizer, prompts, tmp_path / "greedy", config, batch_size=1, progress=False)
    _, rows = load_distill_data(tmp_path / "greedy")
    assert len(rows) == 6
    for row in rows:
        prompt = torch.tensor([row["prompt_ids"]])
        plain = verifier.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False, max_new_tokens=24,
                                  pad_token_id=tokenizer.pad_token_id)[0, prompt.shape[1]:].tolist()
        assert row["response_ids"] == plain[: len(row["response_ids"])] and len(row["response_ids"]) > 0
    with pytest.raises(ValueError, match="one response per prompt"):
        make_distill_data(verifier, tokenizer, prompts, tmp_path / "x", replace(config, samples_per_prompt=2),
                          progress=False)
    with pytest.raises(ValueError, match="temperature must be >= 0"):
        make_distill_data(verifier, tokenizer, prompts, tmp_path / "x", replace(config, temperature=-1.0),
                          progress=False)


def test_training_goes_on_from_a_drafter_folder(workspace):
    """init=<drafter folder> starts from that drafter's weights (lr 0 leaves them as they were) and refuses a
    drafter whose sizes differ from the run's settings."""
    root, _, _ = workspace
    first = train(base_config(root, "first", max_steps=5, draft_vocab_size=32), progress=False)
    again = train(base_config(root, "again", max_steps=2, draft_vocab_size=32, init=str(first), lr=0.0),
                  progress=False)
    a, b = load_file(first / "model.safetensors"), load_file(again / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    recipe = json.loads((again / "training_recipe.json").read_text())
    assert recipe["config"]["init"] == str(first) and recipe["init_recipe"]["config"]["out"] == str(first)
    card = render_card(again, "org/tiny", recipe=recipe)  # both runs, in order
    assert card.index("Trained with `hf_specdiff` (ce-streak objective") < card.index("Then trained further with")
    assert card.count("verifier sampled trajectories (temperature 0.7)") == 2
    log = [json.loads(line) for line in (again / "log.jsonl").read_text().splitlines()]
    assert log[0]["step"] == 0 and log[0]["greedy_streak"] == log[-1]["greedy_streak"]  # lr 0: where it started
    with pytest.raises(ValueError, match="hidden_size 64 there, 32 here; draft_vocab_size 32 there, 0 here"):
        train(base_config(root, "x", init=str(first), hidden_size=32), progress=False)
    with pytest.raises(ValueError, match="init must be random, from-verifier or a drafter folder"):
        train(base_config(root, "x", init="pretrained"), progress=False)
    with pytest.raises(ValueError, match="init_layers copies verifier layers"):
        train(base_config(root, "x", init=str(first), init_layers=1), progress=False)


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


def test_dflash_layout_trains_drafts_and_goes_on(workspace):
    """The dflash layout through the trainer: the verifier's sizes, no embeddings or head saved, drafts accepted."""
    root, verifier, tokenizer = workspace
    settings = dict(layout="dflash", verifier_layers="auto", num_hidden_layers=1, init_layers=1)
    out = train(base_config(root, "dflash", max_steps=150, **settings), progress=False)
    drafter = SpecDiffDrafter.from_pretrained(out).eval()
    config = drafter.config
    assert (config.layout, config.block_size, config.max_draft_tokens, config.hidden_size) == ("dflash", 9, 8, 64)
    assert not any("embed" in k or "lm_head" in k for k in load_file(out / "model.safetensors"))
    report = evaluate_drafter(verifier, tokenizer, drafter, read_prompts(root / "eval.jsonl"), draft_length=8,
                              max_new_tokens=40, progress=False)
    assert report["tau"] > 1.2, report
    more = train(base_config(root, "dflash-more", max_steps=10, init=str(out), **{**settings, "init_layers": 0}),
                 progress=False)
    assert SpecDiffDrafter.from_pretrained(more).config.mask_token_id == config.mask_token_id
    with pytest.raises(ValueError, match="layout=dflash is a conditioned diffusion drafter"):
        train(base_config(root, "x", layout="dflash"), progress=False)


def test_feature_cache_holds_each_rows_verifier_features(workspace, tmp_path):
    """Cached features are the verifier's over the whole row, and windows take the rows of their own tokens."""
    import shutil

    from hf_specdiff.feature_cache import attach_features, cache_path
    from hf_specdiff.training import sample_windows, verifier_features
    from helpers import tiny_drafter

    root, verifier, _ = workspace
    shutil.copytree(root / "data", tmp_path / "data")
    _, rows = load_distill_data(tmp_path / "data")
    drafter = tiny_drafter(verifier, conditioned=True)
    attach_features(tmp_path / "data", verifier, drafter, rows, progress=False)
    assert cache_path(tmp_path / "data", drafter.config.verifier_layer_ids).exists()
    for row in rows[:3]:
        ids = torch.tensor([row["prompt_ids"] + row["response_ids"]])
        expected = verifier_features(verifier, drafter, ids, torch.ones_like(ids, dtype=torch.bool))[0]
        torch.testing.assert_close(row["features"].float(), expected, rtol=2e-2, atol=2e-2)  # stored in bf16
    long = next(r for r in rows if len(r["prompt_ids"]) + len(r["response_ids"]) > 30)
    sequence = long["prompt_ids"] + long["response_ids"]
    ids, valid, features = sample_windows([long], 8, 24, 0, torch.Generator().manual_seed(0))
    assert valid.all()
    for b in range(8):
        start = next(i for i in range(len(sequence)) if sequence[i:i + 24] == ids[b].tolist())
        assert torch.equal(features[b], long["features"][start:start + 24].float())
    again = load_distill_data(tmp_path / "data")[1]
    attach_features(tmp_path / "data", None, drafter, again, progress=False)  # read back: no verifier needed
    assert torch.equal(again[0]["features"], rows[0]["features"])


@pytest.mark.slow
def test_killed_training_resumes_to_the_same_weights(workspace, monkeypatch):
    root, _, _ = workspace
    loads = []  # the trainer state must load without unpickling arbitrary objects
    monkeypatch.setattr(torch, "load", lambda *a, load=torch.load, **k: loads.append(k.get("weights_only")) or
                        load(*a, **k))
    whole = train(base_config(root, "whole", max_steps=120, save_every=20), progress=False)
    config = base_config(root, "killed", max_steps=120, save_every=20)
    args = [sys.executable, "-m", "hf_specdiff.train", *_flags(config)]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": str(torch.get_num_threads())}  # as in-process
    step = _kill_after_checkpoint(args, env, Path(config.out), 40)
    assert 40 <= step < 120, "the run was not killed mid-way"
    assert not (Path(config.out) / "model.safetensors").exists()
    resumed = train(config, progress=False)
    assert loads and all(loads), loads
    a, b = load_file(whole / "model.safetensors"), load_file(resumed / "model.safetensors")
    assert a.keys() == b.keys()
    differ = {k: (a[k] - b[k]).abs().max().item() for k in a if not torch.equal(a[k], b[k])}
    assert not differ, f"resumed from step {step}, the weights differ (max abs difference): {differ}"


def _kill_after_checkpoint(command: list[str], env: dict, out: Path, step: int) -> int:
    """Start a training `command`, SIGKILL it and every process it started once `out` holds a checkpoint of `step`
    or later, and return the step of the checkpoint left behind."""
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    state = out / "checkpoint" / "state.json"
    deadline = time.time() + 300
    while time.time() < deadline and process.poll() is None:
        if state.exists() and json.loads(state.read_text())["step"] >= step:
            break
        time.sleep(0.02)
    launcher = psutil.Process(process.pid)
    processes = [*launcher.children(recursive=True), launcher]  # torchrun gives its workers their own sessions
    for each in processes:
        each.kill()
    process.wait()
    psutil.wait_procs(processes, timeout=10)
    return json.loads(state.read_text())["step"]


def _flags(config: TrainConfig) -> list[str]:
    return [arg for key, value in vars(config).items() for arg in (f"--{key.replace('_', '-')}", str(value))]


def _losses(out: Path) -> dict[int, float]:
    """The logged loss at each step; a resumed run logs the steps after its checkpoint again: the last one counts."""
    records = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in records if "loss" in r}


@pytest.mark.slow
def test_two_processes_train_as_one_and_resume_after_a_kill(workspace):
    """Two CPU processes (`accelerate launch --multi_gpu --num_processes 2`, torchrun underneath; accelerate's `--cpu`
    launches one process unless it has mpirun): each trains on its half of the same global batch, so the run follows
    the single-process one (up to the rounding of the gradient all-reduce), and a killed run resumes."""
    root, _, _ = workspace
    one = base_config(root, "one-process", max_steps=150, save_every=10, log_every=1, eval_every=150)
    train(one, progress=False)
    two = replace(one, out=str(root / "two-processes"))
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
              "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port",
              "29517", "-m", "hf_specdiff.train", *_flags(two)]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    killed_at = _kill_after_checkpoint(launch, env, Path(two.out), 30)
    assert 30 <= killed_at < 150, f"the run was not killed mid-way (step {killed_at})"
    assert not (Path(two.out) / "model.safetensors").exists()
    result = subprocess.run(launch, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    recipe = json.loads((Path(two.out) / "training_recipe.json").read_text())
    assert recipe["resumed_from_step"] == killed_at and "2 processes" in recipe["machine"]
    a, b = _losses(Path(one.out)), _losses(Path(two.out))
    assert a.keys() == b.keys() == set(range(1, 151))
    differ = max(abs(a[k] - b[k]) / a[k] for k in a)
    assert differ < 1e-4, f"the 2-process losses differ from the 1-process ones by up to {differ:.2e}"  # seen: 5e-6
    assert a[150] < 0.8 * a[1]  # and it learned


def test_reduced_vocabulary_and_init_from_verifier(workspace):
    root, verifier, _ = workspace
    out = train(base_config(root, "small-vocab", draft_vocab_size=32, max_steps=20, hidden_size=32,
                            num_attention_heads=2, num_key_value_heads=1), progress=False)
    drafter = SpecDiffDrafter.from_pretrained(out)
    assert len(drafter.config.draft_token_ids) == 32 and drafter.lm_head.weight.shape == (32, 32)
    assert verifier.generation_config.eos_token_id in drafter.config.draft_token_ids


def test_training_errors(workspace, tmp_path):
    root, _, tokenizer = workspace
    other = tiny_verifier("llama", seed=5)
    other.save_pretrained(tmp_path / "other")
    tokenizer.save_pretrained(tmp_path / "other")
    with pytest.raises(ValueError, match="made by another verifier"):
        train(base_config(root, "x", verifier=str(tmp_path / "other")), progress=False)
    with pytest.raises(ValueError, match="needs seq_len > block_size"):
        train(base_config(root, "x", block_size=48), progress=False)
    with pytest.raises(ValueError, match="objective must be one of"):
        train(base_config(root, "x", objective="kl"), progress=False)
    with pytest.raises(ValueError, match="objective=mdlm takes neither"):
        train(base_config(root, "x", objective="mdlm", kl_weight=1.0), progress=False)
    with pytest.raises(ValueError, match="verifier_layers must be empty, 'auto' or a list"):
        train(base_config(root, "x", verifier_layers="middle"), progress=False)
    with pytest.raises(ValueError, match="does not apply to kind=ar"):
        train(base_config(root, "x", kind="ar", verifier_layers="auto"), progress=False)
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(ValueError, match="holds no prompts"):
        read_prompts(tmp_path / "empty.jsonl")
    (tmp_path / "bad.jsonl").write_text('{"prompt": "a"}\n{"prompt": \n')
    with pytest.raises(ValueError, match="bad.jsonl:2: not valid JSON"):
        read_prompts(tmp_path / "bad.jsonl")
    (tmp_path / "nofield.jsonl").write_text('{"answer": "4"}\n')
    with pytest.raises(ValueError, match="no prompt field"):
        read_prompts(tmp_path / "nofield.jsonl")
    with pytest.raises(FileNotFoundError, match="not a distillation data folder"):
        train(base_config(root, "x", data=str(tmp_path)), progress=False)


def test_cli_help_documents_every_setting(capsys):
    with pytest.raises(SystemExit):
        cli(["train", "--help"])
    text = capsys.readouterr().out
    for name in TrainConfig.__dataclass_fields__:
        assert "--" + name.replace("_", "-") in text


def test_eval_drafter_command(workspace, tmp_path, capsys):
    root, _, _ = workspace
    out = train(base_config(root, "for-eval", max_steps=20), progress=False)
    assert cli(["eval-drafter", "--verifier", str(root / "verifier"), "--drafter", str(out), "--prompts",
                str(root / "eval.jsonl"), "--limit", "3", "--max-new-tokens", "16", "--out", str(tmp_path)]) == 0
    assert "| position | acceptance |" in capsys.readouterr().out
    assert json.loads((tmp_path / "eval.json").read_text())["prompts"] == 3
    assert (tmp_path / "acceptance_by_position.png").stat().st_size > 1000
    _, verifier, tokenizer = workspace
    drafter = SpecDiffDrafter.from_pretrained(out).eval()
    report = evaluate_drafter(verifier, tokenizer, drafter, read_prompts(root / "eval.jsonl")[:2], max_new_tokens=16,
                              draft_length=4, num_denoising_steps=2, progress=False)
    assert report["num_denoising_steps"] == 2 and report["drafter_forwards"] > report["rounds"]  # T=1: < rounds
    assert drafter.config.num_denoising_steps == 1  # evaluated at T=2 without changing the caller's drafter


def test_ar_baseline_trains_and_assists(workspace):
    from transformers import AutoModelForCausalLM

    root, verifier, _ = workspace
    out = train(base_config(root, "ar", kind="ar", max_steps=60), progress=False)
    ar = AutoModelForCausalLM.from_pretrained(out).eval()
    assert type(ar).__name__ == "LlamaForCausalLM" and ar.config.vocab_size == verifier.config.vocab_size
    prompt = torch.tensor([[5, 9, 14, 33]])
    plain = verifier.generate(prompt, max_new_tokens=30, do_sample=False, eos_token_id=None)
    assert verifier.generate(prompt, max_new_tokens=30, do_sample=False, eos_token_id=None,
                             assistant_model=ar).tolist() == plain.tolist()


def test_fingerprint_ignores_dtype():
    from hf_specdiff.data import verifier_identity

    verifier = tiny_verifier("llama")
    assert verifier_identity(verifier) == verifier_identity(tiny_verifier("llama", dtype=torch.bfloat16))
    assert verifier_identity(verifier)["fingerprint"] != verifier_identity(tiny_verifier("llama", seed=1))["fingerprint"]


def test_kl_term_gradient_accumulation_and_bf16(workspace):
    root, _, _ = workspace
    settings = dict(mdlm_weight=0.2, grad_accum=2, precision="bf16", max_steps=12, eval_every=6, log_every=1)
    out = train(base_config(root, "kl-bf16", kl_weight=0.5, **settings), progress=False)
    log = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in log if "loss" in r]
    assert len(losses) == 12 and sum(losses[-3:]) < sum(losses[:3])  # it learns
    without = train(base_config(root, "no-kl-bf16", kl_weight=0.0, **settings), progress=False)
    first = json.loads((without / "log.jsonl").read_text().splitlines()[0])["loss"]
    assert losses[0] > first + 0.05  # same weights and batch at step 1: the KL term adds to the loss
    assert SpecDiffDrafter.from_pretrained(out).config.block_size == 8
