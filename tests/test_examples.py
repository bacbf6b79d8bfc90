"""Each example and experiment script runs end to end on tiny models (the same scripts run on SmolLM2 with default
arguments)."""

import contextlib
import io
import json
import re
import runpy
import sys
from pathlib import Path

import pytest
import torch

from helpers import greedy_sequences, tiny_drafter, tiny_tokenizer, tiny_verifier, train_briefly

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("examples")
    verifier, tokenizer = tiny_verifier("llama"), tiny_tokenizer()
    verifier.save_pretrained(root / "verifier")
    tokenizer.save_pretrained(root / "verifier")
    drafter = train_briefly(tiny_drafter(verifier, block_size=8),
                            greedy_sequences(verifier, torch.randint(4, 96, (16, 5)), 40), steps=60)
    drafter.save_pretrained(root / "drafter")
    conditioned = tiny_drafter(verifier, block_size=8, conditioned=True)
    train_briefly(conditioned, greedy_sequences(verifier, torch.randint(4, 96, (16, 5)), 40), steps=60,
                  verifier=verifier)
    conditioned.save_pretrained(root / "conditioned")
    with (root / "prompts.jsonl").open("w") as f:
        for i in range(12):
            f.write(json.dumps({"category": ["qa", "math"][i % 2], "turns": [f"t{5 + i} t9 t{30 + i}"],
                                "prompt": f"t{5 + i} t9 t{30 + i}"}) + "\n")
    return root


def run(script: str, *args: str) -> str:
    """Run `python <script> <args>` (a path from the repository's root) in this process (sparing a second interpreter's ~8 s of imports) and
    return what it printed. The script sees its own argv, its folder on the path and `__name__ == "__main__"`."""
    path = REPO / script
    saved = sys.argv, list(sys.path), torch.get_num_threads(), torch.backends.mkldnn.enabled
    sys.argv, sys.path[:0] = [str(path), *args], [str(path.parent)]
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            runpy.run_path(str(path), run_name="__main__")
    except SystemExit as exit:
        assert exit.code in (None, 0), out.getvalue()[-3000:]
    finally:
        sys.argv, sys.path[:] = saved[0], saved[1]
        torch.set_num_threads(saved[2])
        torch.backends.mkldnn.enabled = saved[3]
    return out.getvalue()


@pytest.mark.parametrize("kind", ["drafter", "conditioned"])
def test_quickstart(models, kind):
    out = run("examples/quickstart.py", "--verifier", str(models / "verifier"), "--drafter", str(models / kind),
              "--prompt", "t5 t9 t14", "--max-new-tokens", "20")
    assert "identical to plain greedy: True" in out


@pytest.mark.parametrize("kind", ["drafter", "conditioned"])
def test_pipeline(models, kind):
    out = run("examples/pipeline.py", "--verifier", str(models / "verifier"), "--drafter", str(models / kind),
              "--prompt", "t5 t9 t14", "--max-new-tokens", "20")
    assert "identical to the plain pipeline: True" in out


def test_self_selection(models):
    out = run("examples/self_selection.py", "--verifier", str(models / "verifier"), "--drafter", str(models / "drafter"),
              "--prompt", "t5 t9 t14", "--max-new-tokens", "20")
    assert "all entry points identical to plain greedy: True" in out


def test_train_drafter(models, tmp_path):
    out = run("examples/train_drafter.py", "--verifier", str(models / "verifier"), "--prompts", str(models / "prompts.jsonl"),
              "--out", str(tmp_path / "run"), "--steps", "10", "--max-new-tokens", "16", "--hidden-size", "32",
              "--draft-vocab-size", "32")
    assert "| position | acceptance |" in out and (tmp_path / "run" / "drafter" / "model.safetensors").exists()


@pytest.mark.parametrize("kind", ["drafter", "conditioned"])
def test_benchmark(models, tmp_path, kind):
    out = run("examples/benchmark.py", "--verifier", str(models / "verifier"), "--drafter", str(models / kind),
              "--prompts", str(models / "prompts.jsonl"), "--per-category", "1", "--max-new-tokens", "16",
              *(["--dtype", "fp32"] if kind == "drafter" else []), "--out", str(tmp_path / "results"))
    assert "| overall |" in out and (tmp_path / "results" / "results.json").exists()
    assert ("--dtype auto: " in out) == (kind == "conditioned")  # the default: chosen on the cost profile


def test_bench_command_runs_the_methods_asked_for_and_resumes(models, tmp_path, capsys, monkeypatch):
    from hf_specdiff.tools.cli import main

    args = ["bench", "--verifier", str(models / "verifier"), "--drafter", str(models / "conditioned"),
            "--prompts", str(models / "prompts.jsonl"), "--per-category", "1", "--max-new-tokens", "8",
            "--dtype", "fp32", "--threads", "1", "--method", "SpecDiff-2 conditioned (K=4)", "--out", str(tmp_path)]
    assert main(args) == 0
    summary = json.loads((tmp_path / "results.json").read_text())
    assert summary["methods"] == ["plain", "SpecDiff-2 conditioned (K=4)"]
    assert len((tmp_path / "records.jsonl").read_text().splitlines()) == 1 + 2
    assert main(args) == 0  # everything is already done: the rerun reads the records back
    assert json.loads((tmp_path / "results.json").read_text())["records"] == summary["records"]
    assert main([a if a != "8" else "9" for a in args]) == 2
    assert "other settings (then, now: {'max_new_tokens': (8, 9)})" in capsys.readouterr().err
    from hf_specdiff.tools import bench

    dtypes, benchmark = [], bench.benchmark
    monkeypatch.setattr(bench, "benchmark", lambda verifier, *a, **k: dtypes.append(
        (verifier.dtype, k["conditioned_drafter"].dtype)) or benchmark(verifier, *a, **k))
    mixed = tmp_path / "bf16-drafter"  # a drafter in another dtype than the verifier: still lossless
    assert main(args[:-1] + [str(mixed), "--drafter-dtype", "bf16"]) == 0
    assert dtypes == [(torch.float32, torch.bfloat16)]
    summary = json.loads((mixed / "results.json").read_text())
    assert summary["settings"]["drafter_dtype"] == "bf16"
    assert all(result["exact_match"] == 1.0 for result in summary["results"]["math"].values()), summary["results"]


def test_tree_tau(models, tmp_path):
    out = run("experiments/tree_tau.py", "--verifier", str(models / "verifier"), "--drafter", str(models / "drafter"),
              "--prompts", str(models / "prompts.jsonl"), "--categories", "qa", "--per-category", "2",
              "--max-new-tokens", "16", "--fp32", "--configs", "shipped,shipped:1,lookup-tree,hf-lookup",
              "--out", str(tmp_path / "tau.json"))
    saved = json.loads((tmp_path / "tau.json").read_text())
    result = saved["results"]
    assert set(result) == {"qa", "overall"} and json.loads(out) == result
    assert set(result["overall"]) == {"shipped", "shipped:1", "lookup-tree", "hf-lookup"}
    assert all(row["tokens"] == 32 and 1 <= row["tau"] <= 16 for row in result["overall"].values())
    texts = {row["text"] for prompt in saved["prompts"] for key, row in prompt.items() if key != "category"}
    assert len(saved["prompts"]) == 2 and len(texts) == 2  # fp32: every method writes each prompt's plain text


def test_sampling_vs_commit(models, tmp_path):
    run("experiments/sampling_vs_commit.py", "HEAD", "--verifier", str(models / "verifier"), "--drafter", str(models / "drafter"),
        "--prompts", str(models / "prompts.jsonl"), "--per-category", "1", "--max-new-tokens", "12",
        "--out", str(tmp_path / "sampling.json"))
    saved = json.loads((tmp_path / "sampling.json").read_text())
    assert set(saved["summary"]) == {"plain", "prompt lookup", "drop-in at HEAD", "drop-in, this checkout",
                                     "K=1 at HEAD", "K=1, this checkout", "K=4 + lookup at HEAD", "K=4 + lookup, this checkout"}
    assert saved["summary"]["plain"]["tau"] == 1.0 and len(saved["prompts"]) == 2
    rows = [row for prompt in saved["prompts"] for key, row in prompt.items() if key != "category"]
    assert len(rows) == 16 and all(1 <= row["tokens"] <= 12 for row in rows)  # a sampled answer may end early


def test_lookup_acceptance_by_ngram(models, tmp_path):
    out = run("experiments/lookup_acceptance_by_ngram.py", "--verifier", str(models / "verifier"), "--prompts",
              str(models / "prompts.jsonl"), "--per-category", "2", "--max-new-tokens", "24", "--lookup-tokens", "4",
              "--out", str(tmp_path / "by_ngram.json"))
    rows = json.loads((tmp_path / "by_ngram.json").read_text())["results"]
    overall = {key: row for key, row in rows.items() if key.startswith("all/")}
    assert overall and all(key.split("/")[0] in ("qa", "math", "all") for key in rows)
    assert all(key.split("/")[1] in ("n1", "n2", "n3", "n4") for key in rows)
    assert all(0 <= row["first_accepted"] <= row["mean_accepted"] <= 4 for row in rows.values())
    for key, row in overall.items():  # each round counts once per occurrence, once per category and once overall
        assert rows[key.replace("latest", "earliest") if "latest" in key else key.replace("earliest", "latest")][
            "rounds"] == row["rounds"] == sum(r["rounds"] for k, r in rows.items()
                                                 if not k.startswith("all/") and k.split("/", 1)[1] == key[4:])
    assert "all/n" in out


def test_draft_processors_cost(models):
    out = run("experiments/draft_processors_cost.py", "--rows", "1,3", "--vocab-size", "2048", "--repeats", "1", "--threads", "1")
    assert re.findall(r"(\d+) rows: transformers' warpers \+ multinomial [0-9.]+ ms, draft_processors", out) == ["1", "3"]


def test_verifier_cost(models):
    out = run("experiments/verifier_cost.py", "--verifier", str(models / "verifier"), "--dtype", "fp32", "--context", "20,40",
              "--rows", "1,4", "--threads", "1", "--attn", "eager", "--tree", "--onednn", "off")
    assert "eager, oneDNN off" in out and "after 20 tokens: k=1" in out and "after 40 tokens: k=1" in out and "k=4" in out
    assert len(re.findall(r"k=1 [0-9.]+ ms \(1\.00x\)", out)) == 2  # each context relative to its own k=1
    assert len(re.findall(r"tree / chain after \d+ tokens: k=4 [0-9.]+ ms \([0-9.]+\)\n", out)) == 2


def test_verifier_cost_tree_forward_is_the_tree_loops(models):
    """The experiment's tree forward gives each node the logits the verifier gives that node's path as a chain."""
    sys.path.insert(0, "experiments")
    try:
        import verifier_cost
    finally:
        sys.path.pop(0)
    from transformers import AutoModelForCausalLM, DynamicCache

    from hf_specdiff.costs_specdiff import CACHE_KWARG

    model = AutoModelForCausalLM.from_pretrained(models / "verifier", dtype=torch.float32).eval()
    vocab = model.config.vocab_size
    torch.manual_seed(0)
    context, token = torch.randint(0, vocab, (1, 12)), torch.randint(0, vocab, (1, 1))
    tree = verifier_cost.tree_of(7, vocab)
    assert len(tree) == 7 and sorted(len(tree.path(n)) for n in range(7)).count(1) == 4  # 4 branches: 2, 2, 2, 1
    with torch.no_grad():
        cache = DynamicCache(config=model.config)
        model(input_ids=context, **{CACHE_KWARG: cache}, use_cache=True)
        logits = verifier_cost.tree_forward(model, cache, token, tree)[0]
        for node in range(len(tree)):
            path = tree.tokens[tree.path(node)]
            chain = model(input_ids=torch.cat([context, token, path[None]], 1)).logits[0, -1]
            torch.testing.assert_close(logits[1 + node], chain, atol=1e-4, rtol=1e-4)


def test_learning_curves(models, tmp_path):
    import shutil

    run_dir = tmp_path / "run"
    shutil.copytree(models / "conditioned", run_dir)
    (run_dir / "training_recipe.json").write_text(json.dumps({
        "config": {"batch_size": 2, "grad_accum": 1, "seq_len": 8, "layout": "specdiff", "num_hidden_layers": 2},
        "data": {"train_rows": 5}, "steps": 20, "wall_time_s": 1.0}))
    (run_dir / "log.jsonl").write_text("".join(json.dumps(
        {"step": step, "loss": 1.0, "acceptance_by_position": [0.5, 0.3, 0.2, 0.1, 0.1], "greedy_streak": 0.9,
         "expected_streak": 0.7}) + "\n" for step in (10, 20)) + json.dumps({"step": 15, "loss": 1.0}) + "\n")
    run("experiments/learning_curves.py", str(run_dir), "--out", str(tmp_path / "out"), "--verifier", str(models / "verifier"),
        "--dtype", "fp32", "--threads", "1")
    result = json.loads((tmp_path / "out" / "learning_curves.json").read_text())
    curve = result["runs"][0]
    assert [p["training_tokens"] for p in curve["points"]] == [160, 320]  # steps x batch x seq_len
    assert curve["points"][0]["acceptance_by_position"] == [0.5, 0.3, 0.2, 0.1] and curve["drafter_ms"] > 0
    assert result["verifier_ms"]["1 token"] > 0 and (tmp_path / "out" / "learning_curves.png").stat().st_size > 5000


def test_held_out_acceptance(models, tmp_path):
    import shutil

    run("examples/train_drafter.py", "--verifier", str(models / "verifier"), "--prompts", str(models / "prompts.jsonl"),
        "--out", str(tmp_path / "run"), "--steps", "10", "--max-new-tokens", "40", "--hidden-size", "32",
        "--draft-vocab-size", "32")
    shutil.copytree(tmp_path / "run" / "drafter", tmp_path / "run" / "again")
    out = tmp_path / "held_out.json"
    run("experiments/held_out_acceptance.py", str(tmp_path / "run" / "drafter"), str(tmp_path / "run" / "again"), "--out", str(out),
        "--windows", "64", "--threads", "1")
    runs = json.loads(out.read_text())["runs"]
    assert runs["drafter"] == runs["again"]  # the same windows for every drafter
    p, n = runs["drafter"]["acceptance_by_position"][0], runs["drafter"]["blocks"]
    assert len(runs["drafter"]["acceptance_by_position"]) == 4 and n > 0
    assert runs["drafter"]["position_1_standard_error"] == round((p * (1 - p) / n) ** 0.5, 4)
    data = json.loads((tmp_path / "run" / "drafter" / "training_recipe.json").read_text())["config"]["data"]
    run("experiments/held_out_acceptance.py", str(tmp_path / "run" / "drafter"), "--data", f"{data},", "--out", str(out),
        "--windows", "64", "--threads", "1")  # another spelling of the same folder: the same held-out rows
    assert json.loads(out.read_text())["data"] == f"{data}," and json.loads(out.read_text())["runs"]["drafter"] == \
        runs["drafter"]


@pytest.mark.parametrize("kind", ["drafter", "conditioned"])
def test_plain_step_overhead(models, kind, monkeypatch):
    from hf_specdiff import decoding
    from hf_specdiff.policies_specdiff import DraftLengthPolicy

    # the script forces these in-process; monkeypatch puts back what they were when the test ends
    monkeypatch.setattr(DraftLengthPolicy, "next_length", DraftLengthPolicy.next_length)
    monkeypatch.setattr(decoding, "tree_budget", decoding.tree_budget)
    out = run("experiments/plain_step_overhead.py", "--verifier", str(models / "verifier"), "--drafter",
              str(models / kind), "--dtype", "fp32", "--prompt", "t5 t9", "--max-new-tokens", "6", "--repeats", "2")
    assert [line.split(":")[0] for line in out.splitlines()] == ["plain generate", "K=1 loop", "K=4 + lookup loop",
                                                                  "drop-in loop"], out
    assert "(1.000x plain)" in out.splitlines()[0]


def test_modeled_speedup_is_plain_greedys_text_on_a_virtual_clock(models, tmp_path):
    """Every variant writes plain greedy's tokens; the clock, not the wall, times them (a second run gives the same
    seconds), and the loop's modules are as they were afterwards."""
    import hf_specdiff.decoding as decoding
    from transformers import AutoModelForCausalLM, AutoTokenizer

    verify, prompt_lookup = decoding.TreeDecoding.verify, decoding.prompt_lookup
    profile = tmp_path / "dear.json"
    profile.write_text(json.dumps({"verifier": {"1": 0.01, "2": 0.011, "16": 0.02}, "drafter": {"1": 0.001}}))
    variants = ["--variant", "pooled", "--variant", "by-ngram-decay0.8"]
    common = ["--verifier", str(models / "verifier"), "--drafter", str(models / "drafter"), "--no-demo",
              "--spec-bench", str(models / "prompts.jsonl"), "--per-category", "1", "--max-new-tokens", "16",
              "--threads", "1", "--profile", str(profile), *variants]
    for name in ("a", "b"):
        run("experiments/modeled_speedup.py", *common, "--out", str(tmp_path / f"{name}.jsonl"))
    assert decoding.TreeDecoding.verify is verify and decoding.prompt_lookup is prompt_lookup
    first, second = ([json.loads(line) for line in (tmp_path / f"{name}.jsonl").read_text().splitlines()]
                     for name in ("a", "b"))
    assert len(first) == 4 and [r["seconds"] for r in first] == [r["seconds"] for r in second]
    verifier = AutoModelForCausalLM.from_pretrained(models / "verifier")
    tokenizer = AutoTokenizer.from_pretrained(models / "verifier")
    prompts = [json.loads(line)["prompt"] for line in (models / "prompts.jsonl").read_text().splitlines()[:2]]
    for row in first:
        inputs = tokenizer.apply_chat_template([{"role": "user", "content": prompts[int(row["id"])]}],
                                               add_generation_prompt=True, return_tensors="pt", return_dict=True)
        plain = verifier.generate(**inputs, max_new_tokens=16, do_sample=False)
        assert row["tokens"] == plain[0, inputs["input_ids"].shape[1]:].tolist()
        assert row["plain_seconds"] == pytest.approx(0.01 * row["new_tokens"]) and row["seconds"] > 0
    run("experiments/modeled_speedup.py", *common, "--out", str(tmp_path / "a.jsonl"))  # resumed: nothing to add
    assert len((tmp_path / "a.jsonl").read_text().splitlines()) == 4
    table = run("experiments/modeled_speedup.py", "--summarize", str(tmp_path / "a.jsonl"))
    assert "| dear | pooled |" in table and "| dear | by-ngram-decay0.8 |" in table


def test_tree_loop_vs_commit(models, tmp_path):
    """Every method's row per prompt (fp32: the loops write plain greedy's text, so as many tokens), and the summary's
    comparison with the earlier commit's loop."""
    out = run("experiments/tree_loop_vs_commit.py", "HEAD", "--verifier", str(models / "verifier"), "--drafter",
              str(models / "drafter"), "--spec-bench", str(models / "prompts.jsonl"), "--per-category", "1",
              "--prompts", "0", "--dtype", "fp32", "--max-new-tokens", "12",
              "--methods", "plain,old,new,learned-tree-costs,sloped-tree-costs")
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert [row["m"] for row in rows] == ["plain", "old", "new", "learned-tree-costs", "sloped-tree-costs"]
    assert all(row["tau"] * row["fwd"] == pytest.approx(12, abs=0.01) for row in rows), rows  # 12 tokens each
    assert rows[0]["tau"] == 1 and rows[0]["d_calls"] == 0
    (tmp_path / "rows.jsonl").write_text(out)
    table = run("experiments/tree_loop_vs_commit.py", "--summarize", str(tmp_path / "rows.jsonl"))
    assert "| old |" in table and "of 1 |" in table.split("| new |")[1]


def test_policy_ablation_model(models, tmp_path):
    """Each variant's modeled row per prompt, resumable; every variant writes plain greedy's text (fp32)."""
    profile = tmp_path / "cheap.json"
    profile.write_text(json.dumps({"verifier": {"1": 0.01, "2": 0.0101, "16": 0.011}, "drafter": {"1": 0.001}}))
    common = ["--profile", str(profile), "--variant", "shipped", "--variant", "old", "--verifier", str(models / "verifier"),
              "--drafter", str(models / "drafter"), "--no-demo", "--spec-bench", str(models / "prompts.jsonl"),
              "--per-category", "1", "--max-new-tokens", "12", "--threads", "1", "--out", str(tmp_path / "rows.jsonl")]
    run("experiments/policy_ablation_model.py", *common)
    run("experiments/policy_ablation_model.py", *common)  # resumed: nothing to add
    rows = [json.loads(line) for line in (tmp_path / "rows.jsonl").read_text().splitlines()]
    assert sorted((row["variant"], row["id"]) for row in rows) == [("old", "0"), ("old", "1"), ("shipped", "0"),
                                                                  ("shipped", "1")]
    assert all(row["speedup"] > 0 and row["tau"] >= 1 for row in rows)


def test_cost_drift_model(models, tmp_path):
    """On a machine as fast as its profile every variant prices rounds alike (the same seconds); slowed, the clock
    charges the slowdown; every row is plain greedy's text; the loop's RoundCosts is as it was afterwards."""
    from hf_specdiff.costs_specdiff import RoundCosts

    from_prior = RoundCosts._from_prior
    profile = tmp_path / "dear.json"
    profile.write_text(json.dumps({"verifier": {"1": 0.01, "2": 0.011, "16": 0.02}, "drafter": {"1": 0.001}}))
    out = tmp_path / "rows.jsonl"
    common = ["--verifier", str(models / "verifier"), "--drafter", str(models / "drafter"), "--no-demo", "--spec-bench",
              str(models / "prompts.jsonl"), "--per-category", "1", "--max-new-tokens", "16", "--threads", "1",
              "--profile", str(profile), "--variant", "additive", "--variant", "shipped", "--out", str(out)]
    run("experiments/cost_drift_model.py", *common, "--slowdown", "1.0", "--slowdown", "2.0")
    table = run("experiments/cost_drift_model.py", *common, "--slowdown", "2.0", "--overhead", "0.001")  # added to
    assert RoundCosts._from_prior is from_prior
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 12 and len({tuple(r["tokens"]) for r in rows if r["id"] == "0"}) == 1
    for row in rows:
        assert row["plain_seconds"] == pytest.approx((0.01 * row["slowdown"] + row["overhead"]) * row["new_tokens"])
    same_speed = {(r["id"], r["variant"]): r["seconds"] for r in rows if r["slowdown"] == 1.0}
    assert same_speed[("0", "additive")] == same_speed[("0", "shipped")]
    assert "| 2.0 | 1.0 ms | shipped |" in table and "| 1.0 | 0.0 ms | additive |" in table


def test_probe_kinds_model(models, tmp_path):
    """Where a verified token is dear and the drafter's call cheap, the shadow rows probe without verifying and take
    less time than the verified ones on every path, the drop-in path's forwards charged by their new tokens (its
    prompt's as one step); every row is plain greedy's text; the policy is as it was afterwards."""
    from hf_specdiff.policies_specdiff import DraftLengthPolicy

    shadow_probe_pays = DraftLengthPolicy._shadow_probe_pays
    profile = tmp_path / "dear.json"
    profile.write_text(json.dumps({"verifier": {"1": 0.01, "2": 0.03, "16": 0.3}, "drafter": {"1": 0.001}}))
    out = tmp_path / "rows.jsonl"
    common = ["--verifier", str(models / "verifier"), "--drafter", str(models / "conditioned"), "--no-demo",
              "--spec-bench", str(models / "prompts.jsonl"), "--per-category", "1", "--max-new-tokens", "24",
              "--threads", "1", "--profile", str(profile), "--out", str(out)]
    run("experiments/probe_kinds_model.py", *common)
    run("experiments/probe_kinds_model.py", *common)  # resumed: nothing to add
    assert DraftLengthPolicy._shadow_probe_pays is shadow_probe_pays
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 2 * 3 * 2 and all(len({tuple(r["tokens"]) for r in rows if r["id"] == i}) == 1 for i in "01")
    seconds = {(r["id"], r["path"], r["probes"]): r["seconds"] for r in rows}
    for row in rows:
        assert row["plain_seconds"] <= row["seconds"] < 1.5 * row["plain_seconds"], row
        if row["path"] != "drop-in":
            assert (row["shadow_probes"] > 0) == (row["probes"] == "shadow"), row
        else:  # plain steps and the probes, as in the K=1 loop: its prompt's forward was charged as one step
            assert row["seconds"] == pytest.approx(seconds[(row["id"], "k1", row["probes"])], rel=0.08), row
        if row["probes"] == "shadow":
            assert row["seconds"] < seconds[(row["id"], row["path"], "verified")], row
    table = run("experiments/probe_kinds_model.py", "--summarize", str(out))
    assert "| dear | drop-in | shadow |" in table and "| dear | k1 | verified |" in table


def test_lookup_decay_ab(models, tmp_path):
    import hf_specdiff.decoding as decoding

    shipped = decoding.LOOKUP_ACCEPTANCE_DECAY
    out = run("experiments/lookup_decay_ab.py", "--decay", "1.0", "--decay", "0.5", "--verifier", str(models / "verifier"),
              "--drafter", str(models / "drafter"), "--dtype", "fp32", "--no-demo", "--spec-bench",
              str(models / "prompts.jsonl"), "--per-category", "1", "--max-new-tokens", "12", "--repeats", "2",
              "--threads", "1", "--out", str(tmp_path / "ab.json"))
    saved = json.loads((tmp_path / "ab.json").read_text())
    assert decoding.LOOKUP_ACCEPTANCE_DECAY == shipped and "spec-bench" in out
    assert set(saved["summary"]) == {"spec-bench"} and set(saved["summary"]["spec-bench"]) == {"plain", "1.0", "0.5"}
    assert [row["category"] for row in saved["prompts"]] == ["qa", "math"]
    for row in saved["prompts"]:  # fp32: every setting writes plain greedy's text, as many tokens
        assert len({m["tokens"] for m in row["methods"].values()}) == 1 and row["methods"]["plain"]["tau"] == 1.0


def test_round_cost_calibration(models):
    import hf_specdiff.decoding as decoding

    verify = decoding.TreeDecoding.verify
    out = run("experiments/round_cost_calibration.py", "--verifier", str(models / "verifier"), "--drafter",
              str(models / "drafter"), "--max-new-tokens", "12", "--threads", "1")
    assert decoding.TreeDecoding.verify is verify
    assert re.search(r"tree rounds' verifier forwards: [0-9.]+ s measured, [0-9.]+ s by the profile \([0-9.]+x\)", out)
    assert re.search(r"the loop's rest \(host work\): -?[0-9.]+ s of [0-9.]+ s", out)
