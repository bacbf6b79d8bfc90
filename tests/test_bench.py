"""The benchmark harness on tiny models: every method, interleaved, with its outputs."""

import dataclasses
import json

import pytest
import torch

import hf_specdiff.costs_specdiff as costs_specdiff
from hf_specdiff.costs_specdiff import CostProfile
from hf_specdiff.tools.bench import (PLAIN_AGAIN, PLAIN_WITH_KERNELS, bench_methods, benchmark, by_kind, read_spec_bench,
                                     save)
from helpers import tiny_dflash_drafter, greedy_sequences, tiny_drafter, tiny_tokenizer, tiny_verifier, train_briefly


@pytest.mark.slow
def test_bench_runs_every_method_and_writes_results(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_SPECDIFF_COSTS", str(tmp_path / "costs"))  # no cost profile yet
    monkeypatch.setattr(costs_specdiff, "_PROFILES", {})
    questions = tmp_path / "question.jsonl"
    with questions.open("w") as f:
        for i, category in enumerate(["qa", "qa", "qa", "math", "math"]):
            f.write(json.dumps({"question_id": i, "category": category, "turns": [f"t{5 + i} t9 t{20 + i} t7"]}) + "\n")
    prompts = read_spec_bench(questions, per_category=2)
    assert [p["category"] for p in prompts] == ["qa", "qa", "math", "math"]

    verifier, tokenizer = tiny_verifier("llama"), tiny_tokenizer()
    drafter = train_briefly(tiny_drafter(verifier, block_size=8),
                            greedy_sequences(verifier, torch.randint(4, 96, (16, 5)), 40), steps=80)
    conditioned = tiny_drafter(verifier, block_size=8, conditioned=True)
    summary = benchmark(verifier, tokenizer, prompts, drafter=drafter, mdlm_drafter=tiny_drafter(verifier),
                        ar_drafter=tiny_verifier("llama", seed=1), conditioned_drafter=conditioned, num_drafts=(1, 4),
                        max_new_tokens=24, with_lookup=True, progress=False)
    specdiff2 = ["SpecDiff-2 (K=1)", "SpecDiff-2 (K=4)", "SpecDiff-2 conditioned (K=1)", "SpecDiff-2 conditioned (K=4)"]
    specdiff = ["SpecDiff (mdlm, K=1)", "SpecDiff (mdlm, K=4)", *specdiff2]
    drop_in = ["SpecDiff-2 drop-in", "SpecDiff-2 drop-in, drafter only", "SpecDiff-2 conditioned drop-in",
               "SpecDiff-2 conditioned drop-in, drafter only"]
    methods = ["plain", PLAIN_AGAIN, "prompt lookup", "AR drafter", "SpecDiff (mdlm, K=1)", "SpecDiff (mdlm, K=4)",
               *drop_in[:2], *specdiff2[:2], *drop_in[2:], *specdiff2[2:], *[f"{m} + lookup" for m in specdiff]]
    assert summary["methods"] == methods
    assert set(summary["results"]) == {"math", "qa", "overall"}
    overall = summary["results"]["overall"]
    for method in methods:
        assert overall[method]["exact_match"] == 1.0  # fp32: every method reproduces plain greedy
        assert overall[method]["prompts"] == 4 and overall[method]["tok_s"] > 0
    assert overall["plain"]["tau"] == 1.0 and overall["plain"]["speedup"] == 1.0
    assert overall[PLAIN_AGAIN]["tau"] == 1.0 and overall[PLAIN_AGAIN]["speedup"] > 0  # the noise floor
    # the machine's cost profile was measured before timing: no method's record holds its forwards
    assert all(r["forwards"] <= r["tokens"] for r in summary["records"]) and list((tmp_path / "costs").iterdir())
    assert overall["SpecDiff-2 (K=1)"]["acceptance_by_position"]
    for method in methods[3:]:  # each drafter's cost was timed beside the verifier's
        assert 0 < overall[method]["drafter_ms_per_forward"] and 0 < overall[method]["drafter_cost"]
    assert overall["plain"]["drafter_cost"] is None and overall[PLAIN_AGAIN]["drafter_cost"] is None
    assert drafter.assistant_lookup_tokens == 10  # the drafter-only method set it to 0 for its runs alone
    # methods are interleaved prompt by prompt
    assert [r["method"] for r in summary["records"][: len(methods)]] == methods
    out = save(summary, tmp_path / "results")
    for name in ("results.json", "results.md", "speedup_by_category.png", "acceptance_by_position.png"):
        assert (out / name).stat().st_size > 0
    assert "| overall |" in (out / "results.md").read_text()
    assert "drafter forward: AR drafter" in (out / "results.md").read_text()
    assert "noise floor: plain again ran " in (out / "results.md").read_text()


def _questions(tmp_path, n=4):
    path = tmp_path / "question.jsonl"
    path.write_text("".join(json.dumps({"category": "qa", "turns": [f"t{5 + i} t9 t{20 + i} t7"]}) + "\n"
                            for i in range(n)))
    return read_spec_bench(path, per_category=n)


def test_bench_runs_only_the_methods_asked_for(tmp_path):
    verifier, tokenizer = tiny_verifier("llama"), tiny_tokenizer()
    drafter = tiny_drafter(verifier, block_size=8)
    summary = benchmark(verifier, tokenizer, _questions(tmp_path, 2), drafter=drafter, num_drafts=(1, 4),
                        max_new_tokens=8, only=["SpecDiff-2 (K=4)"], progress=False)
    assert summary["methods"] == ["plain", "SpecDiff-2 (K=4)"]
    with pytest.raises(ValueError, match=r"unknown method\(s\) \['AR drafter'\].*'SpecDiff-2 \(K=1\)'"):
        benchmark(verifier, tokenizer, _questions(tmp_path, 2), drafter=drafter, only=["AR drafter"], progress=False)


def test_bench_runs_plain_with_the_kernels_the_profile_chose_beside_plain(tmp_path):
    verifier, tokenizer = tiny_verifier("llama", dtype=torch.bfloat16), tiny_tokenizer()
    drafter = tiny_drafter(verifier, block_size=8).to(torch.bfloat16)
    profile = CostProfile({1: 1.0, 2: 1.5, 4: 2.0}, {1: 0.1, 8: 0.1}, onednn_from=3, torch_kernels={1: 2.0, 4: 2.0})
    costs_specdiff.set_cost_profile(verifier, drafter, profile)
    onednn = []
    verifier.model.register_forward_pre_hook(lambda *_: onednn.append(torch.backends.mkldnn.enabled))
    summary = benchmark(verifier, tokenizer, _questions(tmp_path, 1), drafter=drafter, max_new_tokens=6,
                        only=["SpecDiff-2 (K=1)"], progress=False)
    assert summary["methods"] == ["plain", PLAIN_WITH_KERNELS, "SpecDiff-2 (K=1)"]
    assert summary["results"]["overall"][PLAIN_WITH_KERNELS]["tau"] == 1.0 and False in onednn
    costs_specdiff.set_cost_profile(verifier, drafter, dataclasses.replace(profile, onednn_from=None))
    summary = benchmark(verifier, tokenizer, _questions(tmp_path, 1), drafter=drafter, max_new_tokens=6,
                        only=["SpecDiff-2 (K=1)"], progress=False)
    assert summary["methods"] == ["plain", "SpecDiff-2 (K=1)"]  # no other kernels: nothing to compare


def test_bench_labels_a_conditioned_mdlm_drafter_and_gives_it_self_selection_and_lookup(tmp_path):
    verifier, tokenizer = tiny_verifier("llama"), tiny_tokenizer()
    mdlm = tiny_drafter(verifier, block_size=8, conditioned=True)
    names = ["SpecDiff conditioned (mdlm, K=1) + lookup", "SpecDiff conditioned (mdlm, K=4) + lookup"]
    summary = benchmark(verifier, tokenizer, _questions(tmp_path, 2), mdlm_drafter=mdlm, num_drafts=(1, 4),
                        max_new_tokens=12, with_lookup=True, only=names, progress=False)
    assert summary["methods"] == ["plain", *names]
    for name in names:
        assert summary["results"]["overall"][name]["exact_match"] == 1.0


def test_bench_runs_a_dflash_drafter_beside_a_conditioned_one_and_through_transformers_loop(tmp_path):
    verifier, tokenizer = tiny_verifier("llama"), tiny_tokenizer()
    dflash, conditioned = tiny_dflash_drafter(verifier), tiny_drafter(verifier, block_size=8, conditioned=True)
    kinds = by_kind([dflash, conditioned])
    assert kinds == {"drafter": None, "conditioned_drafter": conditioned, "dflash_drafter": dflash}
    names = ["SpecDiff-2 conditioned (K=1)", "SpecDiff-2 dflash drop-in", "SpecDiff-2 dflash, transformers' loop",
             "SpecDiff-2 dflash (K=1)"]
    summary = benchmark(verifier, tokenizer, _questions(tmp_path, 2), **kinds, max_new_tokens=12, only=names,
                        progress=False)
    assert summary["methods"] == ["plain", *names]
    for name in names:
        assert summary["results"]["overall"][name]["exact_match"] == 1.0
    with pytest.raises(ValueError, match="the drafters are the same kind"):
        by_kind([dflash, tiny_dflash_drafter(verifier)])


def test_bench_repeats_alternate_the_order_and_keep_each_methods_fastest_run(tmp_path, monkeypatch):
    import hf_specdiff.tools.bench as bench

    verifier, tokenizer = tiny_verifier("llama"), tiny_tokenizer()
    ran, real_run = [], bench._run_method

    def slow_first_runs(verifier, inputs, options, max_new_tokens, timers, sampling):
        record = real_run(verifier, inputs, options, max_new_tokens, timers, sampling)
        ran.append("plain" if not options else "lookup")
        record["seconds"] = 10.0 - len(ran) if ran[-1] == "plain" else 1.0 + len(ran)  # plain: later is faster
        return record

    monkeypatch.setattr(bench, "_run_method", slow_first_runs)
    summary = benchmark(verifier, tokenizer, _questions(tmp_path, 1), max_new_tokens=8, repeats=3,
                        only=["prompt lookup"], progress=False)
    assert ran == ["plain", "lookup", "lookup", "plain", "plain", "lookup"]
    plain, lookup = summary["records"]
    assert (plain["method"], plain["seconds"]) == ("plain", 10.0 - 5) and lookup["seconds"] == 1.0 + 2
    assert lookup["exact"] and summary["results"]["overall"]["prompt lookup"]["speedup"] == pytest.approx(5 / 3)
    with pytest.raises(ValueError, match="repeats must be at least 1"):
        benchmark(verifier, tokenizer, _questions(tmp_path, 1), max_new_tokens=8, repeats=0, progress=False)


def test_bench_samples_every_method_from_the_same_seed(tmp_path, monkeypatch):
    import hf_specdiff.tools.bench as bench

    verifier, tokenizer = tiny_verifier("llama"), tiny_tokenizer()
    drafter = tiny_drafter(verifier, block_size=8)
    runs, real_run = [], bench._run_method

    def first_draws(verifier, inputs, options, max_new_tokens, timers, sampling):
        record = real_run(verifier, inputs, options, max_new_tokens, timers, sampling)
        runs.append((sampling, record["output"]))
        return record

    monkeypatch.setattr(bench, "_run_method", first_draws)
    sampling = {"temperature": 0.7, "top_p": 0.9}
    summary = benchmark(verifier, tokenizer, _questions(tmp_path, 2), drafter=drafter, num_drafts=(4,),
                        max_new_tokens=8, only=["SpecDiff-2 (K=4)"], sampling=sampling, progress=False)
    assert [s for s, _ in runs] == [dict(sampling, seed=0)] * 2 + [dict(sampling, seed=1)] * 2
    torch.manual_seed(1)  # the second prompt's plain run, repeated by hand, draws the same tokens
    inputs = tokenizer.apply_chat_template([{"role": "user", "content": "t6 t9 t21 t7"}], add_generation_prompt=True,
                                           return_tensors="pt", return_dict=True)
    again = verifier.generate(**inputs, max_new_tokens=8, do_sample=True, temperature=0.7, top_p=0.9)
    assert again[0, inputs["input_ids"].shape[1]:].tolist() == runs[2][1]
    overall = summary["results"]["overall"]
    assert overall["SpecDiff-2 (K=4)"]["exact_match"] is None and overall["SpecDiff-2 (K=4)"]["tok_s"] > 0
    assert "exact" not in bench.markdown_table(summary)


def test_bench_resumes_after_a_crash_without_redoing_finished_prompts(tmp_path):
    verifier, tokenizer = tiny_verifier("llama"), tiny_tokenizer()
    prompts, records = _questions(tmp_path), tmp_path / "results" / "records.jsonl"
    seen = []
    template = tokenizer.apply_chat_template

    def crash_on_third_prompt(*args, **kwargs):
        seen.append(args[0][0]["content"])
        if len(seen) == 3:
            raise KeyboardInterrupt
        return template(*args, **kwargs)

    tokenizer.apply_chat_template = crash_on_third_prompt
    with pytest.raises(KeyboardInterrupt):
        benchmark(verifier, tokenizer, prompts, max_new_tokens=8, records_file=records, progress=False)
    assert len(records.read_text().splitlines()) == 1 + 2  # settings, then the two finished prompts

    seen.clear()
    summary = benchmark(verifier, tokenizer, prompts, max_new_tokens=8, records_file=records, progress=False)
    assert seen == [p["prompt"] for p in prompts[2:]]  # only the unfinished prompts ran again
    assert summary["results"]["overall"]["prompt lookup"]["prompts"] == 4
    assert [r["method"] for r in summary["records"]] == ["plain", PLAIN_AGAIN, "prompt lookup"] * 4
    assert all(r["exact"] for r in summary["records"])

    with pytest.raises(ValueError, match="records of a run with other settings"):
        benchmark(verifier, tokenizer, prompts, max_new_tokens=9, records_file=records, progress=False)


def test_the_recipe_names_only_methods_the_bench_has():
    """The recipe's benches run for hours: a misspelt --method would fail only when its bench starts."""
    import re
    from pathlib import Path
    from types import SimpleNamespace

    recipes = [path.read_text() for path in (Path(__file__).resolve().parents[1] / "recipes").glob("*.sh")]
    assert recipes
    asked = {method for recipe in recipes for method in re.findall(r'--method "([^"]+)"', recipe)}
    kind = lambda conditioned, layout="specdiff": SimpleNamespace(
        config=SimpleNamespace(is_conditioned=conditioned, layout=layout))
    known = set()
    for mdlm_conditioned in (False, True):
        known |= set(bench_methods(kind(False), kind(mdlm_conditioned), object(), kind(True), (1, 4),
                                   with_lookup=True, dflash_drafter=kind(True, "dflash")))
    assert asked and asked <= known, asked - known
