"""Data generation, the trainer's settings and errors, and drafter evaluation (whole runs: test_training_runs.py)."""

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from hf_specdiff.tools.cli import main as cli
from hf_specdiff.training.data import DistillDataConfig, load_distill_data, make_distill_data, read_prompts
from hf_specdiff.training.evaluate import evaluate_drafter
from hf_specdiff.tools.hub import render_card
from hf_specdiff.modeling_specdiff import SpecDiffDrafter
from hf_specdiff.training.trainer import TrainConfig, train
from helpers import tiny_verifier
from training_workspace import base_config, workspace  # noqa: F401 (fixture)


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


def test_data_snapshot_restores_a_lost_run_which_then_resumes(workspace, tmp_path):
    """recipes/data_snapshot.py: a run saved part-way (rows in chunks), lost, restored over a shorter copy and
    resumed ends with an uninterrupted run's rows; the feature cache stays out, and saving again writes the same
    bytes."""
    import importlib.util
    import shutil

    spec = importlib.util.spec_from_file_location(
        "data_snapshot", Path(__file__).resolve().parents[1] / "recipes" / "data_snapshot.py")
    snapshot = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(snapshot)
    snapshot.CHUNK_LINES = 3
    root, verifier, tokenizer = workspace
    prompts = read_prompts(root / "train.jsonl")[:12]
    config = DistillDataConfig(samples_per_prompt=1, temperature=0.0, max_new_tokens=24)
    make_distill_data(verifier, tokenizer, prompts, tmp_path / "full" / "data", config, batch_size=4, progress=False)
    run = tmp_path / "run"
    make_distill_data(verifier, tokenizer, prompts, run / "data", config, batch_size=4, progress=False,
                      max_samples=8, verifier_layer_ids=[0])
    snapshot.save(run, tmp_path / "snap")
    packed = {p.relative_to(tmp_path / "snap"): p.read_bytes() for p in (tmp_path / "snap").rglob("*.gz")}
    assert {p.name for p in packed} == {"data-00000.jsonl.0000.gz", "data-00000.jsonl.0001.gz",
                                        "data-00000.jsonl.0002.gz", "meta.json.gz", "stats.json.gz"}
    snapshot.save(run, tmp_path / "snap")
    assert {p: (tmp_path / "snap" / p).read_bytes() for p in packed} == packed
    first_rows = (run / "data" / "data-00000.jsonl").read_text().splitlines(keepends=True)[:3]
    shutil.rmtree(run)  # lost; then a run elsewhere got as far as 3 rows
    (run / "data").mkdir(parents=True)
    (run / "data" / "data-00000.jsonl").write_text("".join(first_rows))
    snapshot.restore(tmp_path / "snap", run)
    assert len(load_distill_data(run / "data")[1]) == 8
    make_distill_data(verifier, tokenizer, prompts, run / "data", config, batch_size=4, progress=False)
    key = lambda r: (r["prompt_index"], r["sample_index"])  # noqa: E731
    assert sorted(load_distill_data(run / "data")[1], key=key) == \
        sorted(load_distill_data(tmp_path / "full" / "data")[1], key=key)


def test_distill_data_refuses_to_extend_a_folder_with_other_settings_or_dtype(workspace, tmp_path):
    root, verifier, tokenizer = workspace
    prompts = read_prompts(root / "train.jsonl")[:8]
    config = DistillDataConfig(samples_per_prompt=1, temperature=0.0, max_new_tokens=8)
    make_distill_data(verifier, tokenizer, prompts, tmp_path / "data", config, batch_size=4, progress=False,
                      max_samples=4)
    assert json.loads((tmp_path / "data" / "meta.json").read_text())["dtype"] == "float32"
    with pytest.raises(ValueError, match=r"another dtype \(then, now: \{'dtype': \('float32', 'bfloat16'\)\}\)"):
        make_distill_data(verifier.to(torch.bfloat16), tokenizer, prompts, tmp_path / "data", config, batch_size=4,
                          progress=False)
    verifier.float()
    with pytest.raises(ValueError, match="use a new --out folder"):
        make_distill_data(verifier, tokenizer, prompts, tmp_path / "data", replace(config, max_new_tokens=9),
                          batch_size=4, progress=False)
    meta = json.loads((tmp_path / "data" / "meta.json").read_text())
    del meta["dtype"]  # a folder made before the dtype was recorded still resumes
    (tmp_path / "data" / "meta.json").write_text(json.dumps(meta))
    make_distill_data(verifier, tokenizer, prompts, tmp_path / "data", config, batch_size=4, progress=False)
    assert len(load_distill_data(tmp_path / "data")[1]) == 8


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
    assert SpecDiffDrafter.from_pretrained(first).config.context_window == 48 + 8 + 1  # the window it trained on
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

    from hf_specdiff.training.feature_cache import attach_features, cache_path
    from hf_specdiff.training.trainer import sample_windows, verifier_features
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
    ids, valid, features, _ = sample_windows([long], 8, 24, 0, torch.Generator().manual_seed(0))
    assert valid.all()
    for b in range(8):
        start = next(i for i in range(len(sequence)) if sequence[i:i + 24] == ids[b].tolist())
        assert torch.equal(features[b], long["features"][start:start + 24].float())
    again = load_distill_data(tmp_path / "data")[1]
    attach_features(tmp_path / "data", None, drafter, again, progress=False)  # read back: no verifier needed
    assert torch.equal(again[0]["features"], rows[0]["features"])
    with pytest.raises(ValueError, match="no verifier top-4 cached"):
        attach_features(tmp_path / "data", None, drafter, again, top_k=4, progress=False)
    attach_features(tmp_path / "data", verifier, drafter, again, top_k=4, progress=False)
    sequence = torch.tensor([long["prompt_ids"] + long["response_ids"]])
    row = again[rows.index(long)]
    top_ids, top_log_probs = row["verifier_top_k"]
    expected_log_probs, expected_ids = verifier(sequence).logits[0].float().log_softmax(-1).topk(4, dim=-1)
    assert torch.equal(top_ids[1:].long(), expected_ids[:-1])  # at t: the verifier's prediction of token t
    torch.testing.assert_close(top_log_probs[1:].float(), expected_log_probs[:-1], rtol=1e-2, atol=1e-2)  # fp16
    windows = sample_windows([row], 8, 24, 0, torch.Generator().manual_seed(0))
    for b in range(8):
        start = next(i for i in range(len(sequence[0])) if sequence[0, i:i + 24].tolist() == windows.ids[b].tolist())
        assert torch.equal(windows.verifier_top_k[0][b], top_ids[start:start + 24].long())



def test_feature_cache_keeps_its_finished_shards_through_a_crash(workspace, tmp_path, monkeypatch):
    """Features are cached shard by shard: a run killed mid-way keeps the shards it finished, the next run computes
    only the others, and a data folder whose rows change recomputes only the shards they fall in."""
    import shutil

    from hf_specdiff.training import feature_cache
    from hf_specdiff.training.trainer import verifier_features
    from helpers import tiny_drafter

    root, verifier, _ = workspace
    shutil.copytree(root / "data", tmp_path / "data")
    _, rows = load_distill_data(tmp_path / "data")
    assert len(rows) == 96
    drafter = tiny_drafter(verifier, conditioned=True)
    monkeypatch.setattr(feature_cache, "SHARD_ROWS", 16)
    computed, crashed, compute = [], [], feature_cache.compute_features

    def crash_once_at_the_third_shard(verifier, drafter, shard, *args, **kwargs):
        computed.append(len(shard))
        if len(computed) == 3 and not crashed:
            crashed.append(True)
            raise RuntimeError("killed")
        return compute(verifier, drafter, shard, *args, **kwargs)

    monkeypatch.setattr(feature_cache, "compute_features", crash_once_at_the_third_shard)
    with pytest.raises(RuntimeError, match="killed"):
        feature_cache.attach_features(tmp_path / "data", verifier, drafter, rows, progress=False)
    computed.clear()
    rows = load_distill_data(tmp_path / "data")[1]
    feature_cache.attach_features(tmp_path / "data", verifier, drafter, rows, progress=False)
    assert computed == [16] * 4  # shards 0 and 1 were kept
    for row in (rows[0], rows[40], rows[95]):
        ids = torch.tensor([row["prompt_ids"] + row["response_ids"]])
        expected = verifier_features(verifier, drafter, ids, torch.ones_like(ids, dtype=torch.bool))[0]
        torch.testing.assert_close(row["features"].float(), expected, rtol=2e-2, atol=2e-2)
    computed.clear()
    feature_cache.attach_features(tmp_path / "data", verifier, drafter, rows[:88], progress=False)
    feature_cache.attach_features(tmp_path / "data", None, drafter, rows[:88], progress=False)  # read back
    made = []
    make_verifier = lambda: made.append(1) or verifier  # noqa: E731  (a verifier made only if a shard needs it)
    feature_cache.attach_features(tmp_path / "data", make_verifier, drafter, rows[:88], progress=False)
    assert not made
    feature_cache.attach_features(tmp_path / "data", make_verifier, drafter, rows, progress=False)
    assert computed == [8, 16] and made == [1]  # the last shard only, once with 8 rows, then again with 16


def test_distill_data_keeps_the_features_it_reads_while_generating(workspace, tmp_path, monkeypatch):
    """`verifier_layer_ids` writes the feature cache while generating: the teacher-forced features, in the shards
    `attach_features` reads; rows of a shard a run could not complete (data extended later) are computed there."""
    from hf_specdiff.training import feature_cache
    from hf_specdiff.training.trainer import verifier_features
    from helpers import tiny_drafter

    root, verifier, tokenizer = workspace
    drafter = tiny_drafter(verifier, conditioned=True)
    monkeypatch.setattr(feature_cache, "SHARD_ROWS", 16)
    prompts, config = read_prompts(root / "train.jsonl"), DistillDataConfig(samples_per_prompt=1, temperature=0)
    for samples in (24, 48):  # 24 rows: shards of 16 and 8 rows; 48: rows 24-31 cannot complete shard 1
        make_distill_data(verifier, tokenizer, prompts, tmp_path / "data", config, batch_size=8, progress=False,
                          max_samples=samples, verifier_layer_ids=drafter.config.verifier_layer_ids)
    computed, compute = [], feature_cache.compute_features
    monkeypatch.setattr(feature_cache, "compute_features", lambda v, d, shard, *a, **k: computed.append(len(shard))
                        or compute(v, d, shard, *a, **k))
    rows = load_distill_data(tmp_path / "data")[1]
    feature_cache.attach_features(tmp_path / "data", verifier, drafter, rows, progress=False)
    assert computed == [16]  # shard 1 only
    for row in rows[:16:5] + rows[32::5]:
        ids = torch.tensor([row["prompt_ids"] + row["response_ids"]])
        expected = verifier_features(verifier, drafter, ids, torch.ones_like(ids, dtype=torch.bool))[0]
        torch.testing.assert_close(row["features"].float(), expected, rtol=2e-2, atol=2e-2)


def test_training_on_several_data_folders(workspace, tmp_path):
    """Greedy and sampled responses to one prompt set train one drafter: rows of both folders, each folder's
    features cached in it, held-out prompts held out of both; the recipe and card name the mix."""
    import shutil

    from hf_specdiff.training.trainer import split_rows

    root, verifier, tokenizer = workspace
    sampled = tmp_path / "sampled"
    shutil.copytree(root / "data", sampled)
    greedy = make_distill_data(verifier, tokenizer, read_prompts(root / "train.jsonl"), tmp_path / "greedy",
                               DistillDataConfig(samples_per_prompt=1, temperature=0, max_new_tokens=24),
                               batch_size=16, progress=False)
    rows = load_distill_data(sampled)[1] + load_distill_data(greedy)[1]
    train_rows, held = split_rows(rows, 0.1)
    assert {r["prompt_index"] for r in train_rows}.isdisjoint(r["prompt_index"] for r in held) and held
    config = base_config(root, "two-folders", data=f"{sampled},{greedy}", verifier_layers="auto",
                         feature_cache=True, max_steps=4, eval_every=4)
    out = train(config, progress=False)
    recipe = json.loads((out / "training_recipe.json").read_text())
    assert recipe["data"]["train_rows"] == len(train_rows) and recipe["data"]["held_out_rows"] == len(held)
    assert [s["rows"] for s in recipe["data"]["sources"]] == [96, 48]
    assert all(any(folder.glob("features-layers-*/shard-00000.pt")) for folder in (sampled, greedy))
    assert f"{len(train_rows)} verifier trajectories drawn from 96 sampled (temperature 0.7), 48 greedy" in \
        render_card(out, "org/tiny", recipe=recipe)
    fewer = train(replace(config, out=str(root / "two-folders-fewer"), max_train_rows=30), progress=False)
    assert json.loads((fewer / "training_recipe.json").read_text())["data"]["train_rows"] == 30


def test_a_bf16_run_computes_its_feature_cache_with_a_bf16_copy_of_the_verifier(workspace, tmp_path, monkeypatch):
    """Missing cached features come from the verifier in the run's precision (bf16: about twice as fast on a CPU
    with bf16 matmuls, and what the drafter reads at drafting time); an fp32 run's from the fp32 verifier. A run
    whose features are all cached makes no copy of the verifier."""
    import shutil

    from hf_specdiff.training import feature_cache
    from hf_specdiff.training import trainer as training

    root, _, _ = workspace
    for name in ("data", "data-fp32"):
        shutil.copytree(root / "data", tmp_path / name)
    computed, made = [], []
    compute, make = feature_cache.compute_features, training._feature_verifier
    monkeypatch.setattr(feature_cache, "compute_features", lambda verifier, *a, **k:
                        computed.append(next(verifier.parameters()).dtype) or compute(verifier, *a, **k))
    monkeypatch.setattr(training, "_feature_verifier", lambda *a: made.append(1) or make(*a))
    config = base_config(root, "bf16-features", data=str(tmp_path / "data"), verifier_layers="auto",
                         feature_cache=True, precision="bf16", max_steps=1, eval_every=1)
    train(config, progress=False)
    assert set(computed) == {torch.bfloat16} and made == [1]
    computed.clear()
    train(replace(config, out=str(root / "bf16-cached")), progress=False)
    assert computed == [] and made == [1]
    train(replace(config, precision="fp32", data=str(tmp_path / "data-fp32"), out=str(root / "fp32-features")),
          progress=False)
    assert set(computed) == {torch.float32}


def test_kl_from_the_cached_top_k_needs_no_verifier_forward(workspace, tmp_path, monkeypatch):
    """With the feature cache, the KL term reads the verifier's top-k cached beside the features: training runs no
    teacher forward, and the term is in the loss."""
    import shutil

    from hf_specdiff.training import trainer as training

    root, _, _ = workspace
    shutil.copytree(root / "data", tmp_path / "data")

    def no_teacher(*args, **kwargs):
        raise AssertionError("a teacher forward during training")

    monkeypatch.setattr(training, "_teacher_forward", no_teacher)
    config = base_config(root, "kl-top-k", data=str(tmp_path / "data"), verifier_layers="auto", feature_cache=True,
                         kl_weight=1.0, kl_top_k=8, kl_weighting="streak", max_steps=12, eval_every=12, log_every=1)
    losses = [json.loads(line)["loss"] for line in (train(config, progress=False) / "log.jsonl").read_text()
              .splitlines() if "loss" in json.loads(line)]
    assert (tmp_path / "data" / "verifier-top-8" / "shard-00000.pt").exists() and len(losses) == 12
    without = train(replace(config, kl_weight=0.0, max_steps=1, out=str(root / "kl-top-k-without")), progress=False)
    first = json.loads((without / "log.jsonl").read_text().splitlines()[0])["loss"]
    assert losses[0] > first + 0.05  # same weights and batch at step 1: the KL term adds to the loss


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
    make_distill_data(other, tokenizer, ["t1 t2"], tmp_path / "other-data", DistillDataConfig(max_new_tokens=4),
                      progress=False)
    with pytest.raises(ValueError, match="other-data was made by another verifier"):
        train(base_config(root, "x", data=f"{root / 'data'},{tmp_path / 'other-data'}"), progress=False)
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
    from hf_specdiff.training.data import verifier_identity

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
    without = train(base_config(root, "no-kl-bf16", kl_weight=0.0, **{**settings, "max_steps": 1}), progress=False)
    first = json.loads((without / "log.jsonl").read_text().splitlines()[0])["loss"]
    assert losses[0] > first + 0.05  # same weights and batch at step 1: the KL term adds to the loss
    assert SpecDiffDrafter.from_pretrained(out).config.block_size == 8


def test_cpu_processes_join_over_gloo_and_a_one_process_cpu_launch_warns(monkeypatch):
    """Several processes without a GPU need accelerate's cpu=True; accelerate's `--cpu --num_processes N`, which
    starts one process (it sets ACCELERATE_USE_CPU and a MASTER_PORT but WORLD_SIZE stays 1), gets a warning."""
    import warnings

    from hf_specdiff.training.trainer import _several_cpu_processes

    for name in ("WORLD_SIZE", "ACCELERATE_USE_CPU", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not _several_cpu_processes()
        monkeypatch.setenv("WORLD_SIZE", "2")
        assert _several_cpu_processes()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert not _several_cpu_processes()  # GPUs: accelerate's own device placement
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("ACCELERATE_USE_CPU", "true")
    monkeypatch.setenv("MASTER_PORT", "29500")
    with pytest.warns(UserWarning, match="starts one process"):
        assert not _several_cpu_processes()


def test_a_checkpoint_from_before_a_setting_existed_resumes_and_other_settings_are_refused(workspace):
    """A run's checkpoint records its settings; a setting added to TrainConfig since counts at its default."""
    root, _, _ = workspace
    config = base_config(root, "older", max_steps=6, save_every=3, eval_every=6)
    out = train(config, progress=False)
    state = out / "checkpoint" / "state.json"
    saved = json.loads(state.read_text())
    del saved["config"]["kl_top_k"], saved["config"]["kl_weighting"]  # written before these existed
    state.write_text(json.dumps(saved))
    train(config, progress=False)  # resumes at its last step: nothing to do
    with pytest.raises(ValueError, match=r"other settings \(\['kl_weighting'\]\)"):
        train(replace(config, kl_weighting="streak"), progress=False)
