"""Model card rendering, folder validation and the push dry-run (the only push mode testable offline)."""

import json

from hf_specdiff.tools.cli import main
from helpers import tiny_dflash_drafter, tiny_drafter, tiny_verifier


def test_card_validate_and_push_dry_run(tmp_path, capsys):
    folder = tmp_path / "specdiff-tiny"
    tiny_drafter(tiny_verifier("llama"), block_size=8).save_pretrained(folder)
    assert main(["push", str(folder), "--repo", "org/specdiff-tiny", "--dry-run"]) == 2
    assert "missing README.md" in capsys.readouterr().err

    bench = {"methods": ["plain", "SpecDiff-2 (K=1)"], "peak_rss_mb": 100.0, "settings": {"per_category": 1},
             "results": {"overall": {m: {"speedup": s, "tau": t, "exact_match": 1.0, "tok_s": 10.0 * s}
                                     for m, s, t in (("plain", 1.0, 1.0), ("SpecDiff-2 (K=1)", 1.7, 2.4))}}}
    (tmp_path / "results.json").write_text(json.dumps(bench))
    assert main(["card", str(folder), "--base-model", "org/tiny", "--bench", str(tmp_path / "results.json"),
                 "--reproduce", "hf-specdiff train ..."]) == 0
    card = (folder / "README.md").read_text()
    assert card.startswith("---\nlibrary_name: transformers\npipeline_tag: text-generation\nbase_model: org/tiny")
    assert "1.70x (tau 2.40, exact 100%)" in card and "hf-specdiff train ..." in card
    assert "exact = share of outputs identical to plain greedy" in card
    assert 'from_pretrained("<org>/specdiff-tiny", trust_remote_code=True)' in card
    assert "\ndatasets: []\n" in card  # no dataset claimed that the user did not name
    sampled = dict(bench, settings={"temperature": 0.7})  # a sampling bench: no exact-match rate, and it says so
    for row in sampled["results"]["overall"].values():
        row["exact_match"] = None
    (tmp_path / "bench-sampling").mkdir()
    (tmp_path / "bench-sampling" / "results.json").write_text(json.dumps(sampled))
    assert main(["card", str(folder), "--base-model", "org/tiny", "--bench", str(tmp_path / "results.json"),
                 "--bench", str(tmp_path / "bench-sampling" / "results.json")]) == 0
    card = (folder / "README.md").read_text()
    assert "## Benchmark: sampling" in card and "sampling at temperature 0.7, top-p 1.0, every method" in card
    assert "1.70x (tau 2.40) |" in card and "1.70x (tau 2.40, exact 100%)" in card
    assert main(["card", str(folder), "--base-model", "org/tiny", "--dataset", "org/a", "--dataset", "org/b"]) == 0
    assert "\ndatasets:\n  - org/a\n  - org/b\ntags:" in (folder / "README.md").read_text()

    assert main(["push", str(folder), "--repo", "org/specdiff-tiny", "--dry-run"]) == 0
    listed = capsys.readouterr().out
    for name in ("README.md", "config.json", "generation_config.json", "model.safetensors", "modeling_specdiff.py"):
        assert f"  {name}" in listed


def test_validation_catches_a_broken_folder(tmp_path):
    from hf_specdiff.tools.hub import validate_model_folder

    folder = tmp_path / "d"
    tiny_drafter(tiny_verifier("llama")).save_pretrained(folder)
    (folder / "README.md").write_text("no metadata")
    generation = json.loads((folder / "generation_config.json").read_text())
    generation["assistant_confidence_threshold"] = 0.4
    (folder / "generation_config.json").write_text(json.dumps(generation))
    problems = validate_model_folder(folder)
    assert "generation_config.json: assistant_confidence_threshold must be 0" in problems
    assert "README.md: metadata lacks base_model" in problems


def test_card_of_a_conditioned_drafter_says_so_and_attaches(tmp_path):
    from hf_specdiff.tools.hub import render_card

    folder = tmp_path / "specdiff-cond"
    tiny_drafter(tiny_verifier("llama"), conditioned=True).save_pretrained(folder)
    card = render_card(folder, "org/tiny")
    assert "kind: conditioned: reads the verifier's hidden states at layers [0]" in card
    assert "assistant_model=drafter.attach(verifier)" in card and "drafter.detach()" in card
    standalone = tmp_path / "specdiff-alone"
    tiny_drafter(tiny_verifier("llama")).save_pretrained(standalone)
    assert "kind: standalone" in render_card(standalone, "org/tiny")


def test_card_of_a_dflash_drafter_says_it_borrows_the_verifier_and_how_to_export_it(tmp_path):
    from hf_specdiff.tools.hub import render_card

    folder = tmp_path / "specdiff-dflash"
    tiny_dflash_drafter(tiny_verifier("llama")).save_pretrained(folder)
    card = render_card(folder, "org/tiny")
    assert "kind: dflash layout" in card and "does not store" in card
    assert "  - dflash\n" in card.split("---")[1]
    assert 'speculation_type="dflash"' in card and "--format dflash" in card
    assert "block of 8 (the anchor and 7 drafted tokens)" in card
