"""GPU-correct decoding, checked on the CPU: policies time rounds after synchronising an asynchronous device, and a
round reads device values on the host (a synchronisation on a GPU) only where it decides something."""

import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

import hf_specdiff
from hf_specdiff import costs_specdiff, decoding, policies_specdiff
from helpers import PROMPTS, trained_standalone

PACKAGE = Path(hf_specdiff.__file__).resolve().parent
HOST_READS = {"item", "tolist", "__bool__", "__int__", "__float__", "__index__", "cpu", "numpy"}


class DeviceReadCounter(TorchFunctionMode):
    """Counts host reads of device values (`.item()`, `.tolist()`, `int(t)`, ...) by the hf_specdiff function that
    made them. On the CPU no tensor lives on a device, so the "device" tensors are the models' parameters, the
    token ids a generation starts from and everything computed from them (the flag follows every torch call);
    policy arithmetic on host tensors is not counted, as on a GPU it costs no synchronisation."""

    def __init__(self, *models, input_ids: torch.Tensor):
        super().__init__()
        for tensor in [input_ids] + [p for model in models for p in model.parameters()]:
            tensor._on_device = True
        self.reads: Counter = Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        on_device = any(getattr(t, "_on_device", False) for t in tree_flatten((args, kwargs))[0]
                        if isinstance(t, torch.Tensor))
        host_read = on_device and getattr(func, "__name__", "") in HOST_READS
        if host_read:
            self.reads[self._site()] += 1
        out = func(*args, **kwargs)
        if host_read and out is args[0]:  # `.cpu()` of a CPU tensor is the tensor itself; of a GPU one, a copy
            out = out.clone()
        if on_device and not host_read:  # what it returned, and what it wrote into (`t[i] = x`, `out=`)
            for tensor in tree_flatten((out, args, kwargs))[0]:
                if isinstance(tensor, torch.Tensor):
                    tensor._on_device = True
        return out

    @staticmethod
    def _site() -> str:
        frame = sys._getframe(2)
        while frame is not None and not Path(frame.f_code.co_filename).resolve().is_relative_to(PACKAGE):
            frame = frame.f_back
        return "outside hf_specdiff" if frame is None else frame.f_code.co_name


def test_device_clock_synchronises_an_asynchronous_device_and_not_the_cpu(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append(device))
    for clock in (costs_specdiff.device_clock, decoding.device_clock):
        clock(torch.device("cpu"))
        assert calls == []
        clock(torch.device("cuda", 1))
        assert calls == [torch.device("cuda", 1)]
        calls.clear()


def test_every_timed_round_reads_the_clock_of_the_verifiers_device(monkeypatch):
    verifier, drafter = trained_standalone("llama")
    devices = []
    for module in (decoding, policies_specdiff):  # the tree loop, K=1, and the drop-in path's rounds
        clock = module.device_clock
        monkeypatch.setattr(module, "device_clock", lambda device, clock=clock: devices.append(device) or clock(device))
    stats = decoding.SpecDiffStats()
    hf_specdiff.generate(verifier, drafter, PROMPTS[:1], max_new_tokens=24, num_drafts=4, lookup_tokens=4,
                         stats=stats)
    assert len(devices) >= stats.rounds - 1 and set(devices) == {verifier.device}  # rounds after the prompt's
    devices.clear()
    hf_specdiff.generate(verifier, drafter, PROMPTS[:1], max_new_tokens=24)
    assert len(devices) >= 2 and set(devices) == {verifier.device}
    devices.clear()
    verifier.generate(PROMPTS[:1], max_new_tokens=24, assistant_model=drafter, do_sample=False)
    assert len(devices) >= 2 and set(devices) == {verifier.device}


def _reads_per_round(run, verifier, drafter, prompt):
    counter = DeviceReadCounter(verifier, drafter, input_ids=prompt)
    stats = decoding.SpecDiffStats()
    with counter:
        run(stats)
    return {site: count / stats.rounds for site, count in counter.reads.items()}, stats


@pytest.mark.parametrize("lookup_tokens", [0, 4])
def test_a_greedy_tree_round_reads_the_device_only_where_it_decides(lookup_tokens):
    """A greedy tree round waits for the device twice, for what it must decide on the host: the drafter's best
    tokens (which drafts form the tree) and the verifier's argmax walk (what is accepted); the drafter's cache
    compares the committed tokens with what it holds once more. Everything else (lookup drafts, stops, streaming,
    statistics, masks) works from host copies."""
    verifier, drafter = trained_standalone("llama")
    prompt = PROMPTS[:1].clone()
    reads, stats = _reads_per_round(
        lambda stats: hf_specdiff.generate(verifier, drafter, prompt, max_new_tokens=32, num_drafts=4,
                                           lookup_tokens=lookup_tokens, stats=stats), verifier, drafter, prompt)
    assert stats.rounds >= 8
    per_round = {"top_k_drafts", "accept_greedy", "sync"}
    # transformers' set-up, the input checks, the prompt's host copy, the end-of-sequence ids
    per_generation = {"generate", "specdiff_generate", "__call__", "from_criteria"}
    assert set(reads) <= per_round | per_generation, reads
    assert all(reads[site] <= 1 for site in per_round & set(reads)), reads
    assert sum(reads[site] for site in per_generation & set(reads)) * stats.rounds <= 5, reads


def test_a_drop_in_round_reads_the_device_only_in_the_drafters_cache():
    """Called by transformers' assisted loop (which syncs on its own), the drafter's round adds at most the cache's
    comparison: acceptance comes from the sequence's length, the input checks run once per generation; a shadow probe
    (where the measured costs make one cheaper than a verified probe) reads its draft and the tokens committed after
    it."""
    verifier, drafter = trained_standalone("llama")
    prompt = PROMPTS[:1].clone()

    def run(stats):
        out = verifier.generate(prompt, max_new_tokens=40, assistant_model=drafter, do_sample=False)
        stats.rounds = out.shape[1] - prompt.shape[1]  # an upper bound on the rounds: reads per round at least

    reads, _ = _reads_per_round(run, verifier, drafter, prompt)
    ours = {site: count for site, count in reads.items() if site != "outside hf_specdiff"}
    assert set(ours) <= {"sync", "_check_inputs", "prompt_lookup_match", "_lookup_draft", "observe", "shadowed"}, ours


def test_tree_forwards_on_cuda_keep_sdpa_off_cudnn_and_cpu_forwards_untouched(monkeypatch):
    """cuDNN's attention plans every new shape, and a tree forward's shapes change every round: on CUDA the tree
    forward asks sdpa for its memory-efficient (or math) kernel; on the CPU nothing changes."""
    import torch.nn.attention
    from torch.nn.attention import SDPBackend

    chosen, real = [], torch.nn.attention.sdpa_kernel
    monkeypatch.setattr(torch.nn.attention, "sdpa_kernel",
                        lambda backends: chosen.append(list(backends)) or real([SDPBackend.MATH]))
    for device in ("cpu", "cuda"):
        with decoding.tree_attention_kernels(type("Verifier", (), {"device": torch.device(device)})()):
            pass
    assert chosen == [[SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]]  # once: for the CUDA verifier
