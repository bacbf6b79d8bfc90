"""The repository's wiring: CI runs exactly README's test command."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_ci_runs_the_readme_test_command():
    readme = (REPO / "README.md").read_text()
    section = readme.split("Set up and run the tests", 1)[1]
    command = section.split("```bash\n", 1)[1].split("\n```", 1)[0].strip()
    ci_lines = [line.strip() for line in (REPO / ".ci" / "run").read_text().splitlines()]
    assert command in ci_lines


def test_readme_documents_every_config_field():
    from hf_specdiff import SpecDiffConfig

    readme = (REPO / "README.md").read_text()
    for name in ("vocab_size", "block_size", "num_denoising_steps", "unmasking_schedule", "max_position_embeddings",
                 "mask_token_index", "draft_token_ids", "verifier_name_or_path", "eos_token_id"):
        assert hasattr(SpecDiffConfig(), name)
        assert f"`{name}`" in readme, name
