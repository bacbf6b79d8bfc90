"""The GPU session's rehearsal: `DRY_RUN=1 bash recipes/gpu_session.sh` runs every step on this CPU with tiny sizes
and writes the results JSON the GPU run writes, so the job cannot rot between the rare sessions with a GPU."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hf_specdiff.tools.bench import PLAIN_WITH_KERNELS

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_gpu_session_dry_run_runs_every_step_and_writes_the_results(tmp_path):
    out = tmp_path / "out"
    env = dict(os.environ, DRY_RUN="1", PYTHON=sys.executable, OUT=str(out), HF_HUB_OFFLINE="1")
    done = subprocess.run(["bash", "recipes/gpu_session.sh"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=1200)
    log = (out / "session.log").read_text() if (out / "session.log").exists() else done.stdout + done.stderr
    assert done.returncode == 0, log[-3000:]
    assert "FAILED" not in log, log[-3000:]
    results = json.loads((out / "results.json").read_text())
    assert set(results) == {"env", "exactness", "sampling", "bench", "train"}, log[-3000:]
    paths = results["exactness"]["paths"]
    assert len(paths) == 8  # plain and the seven entry points
    for name, row in paths.items():  # fp32 greedy: every entry point writes plain greedy's tokens
        assert "error" not in row and row["prompts"] == row["identical"] == 1, (name, row)
    assert set(results["sampling"]) >= {"K=4 + lookup", "assistant_model= (drop-in)"}
    # plain with SpecDiff's kernels runs too where the CPU's profile chose other kernels (AVX512-BF16, no AMX)
    assert set(results["bench"]["methods"]) - {PLAIN_WITH_KERNELS} == {
        "plain", "SpecDiff-2 conditioned (K=4) + lookup", "SpecDiff-2 dflash, transformers' loop"}
    assert set(results["train"]) == {"specdiff", "dflash"}
    assert all(run["steps_per_second"] > 0 for run in results["train"].values())
    assert {p.name for p in out.iterdir()} >= {"results.json", "session.log", "bench_results.json"}
