import os
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
# cost profiles measured for the tests' models stay out of the user's cache (one folder per test process)
os.environ.setdefault("HF_SPECDIFF_COSTS", tempfile.mkdtemp(prefix="hf_specdiff_costs_"))
if "PYTEST_XDIST_WORKER_COUNT" in os.environ:  # `pytest -n N`: share the cores, in this process and its children
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 2) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))))

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", 2)))


@pytest.fixture(autouse=True)
def _seed_and_threads():
    """Each test starts from seed 0 and leaves the thread count as it found it (the CLI's --threads sets it)."""
    torch.manual_seed(0)
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def _modules_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_MODULES_CACHE", str(tmp_path / "modules"))


@pytest.fixture(autouse=True)
def _own_cost_profiles(monkeypatch):
    """A profile one test sets for its pair (`set_cost_profile`) stays out of the next: tiny models built from the same
    seed share a profile's key."""
    import hf_specdiff.costs_specdiff as costs_specdiff

    monkeypatch.setattr(costs_specdiff, "_PROFILES", {})
