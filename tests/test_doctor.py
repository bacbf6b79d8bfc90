"""The machine's cost profile: measured once, cached per machine and models, read by `hf-specdiff doctor`, the
demo and `--dtype auto`."""

import dataclasses
import json
import os
import re
from pathlib import Path

import pytest
import torch

import hf_specdiff.costs_specdiff as costs_specdiff
from hf_specdiff.tools.doctor import Outlook, fastest, report
from hf_specdiff.costs_specdiff import PROFILE_LENGTHS, CostProfile, cost_profile
from helpers import tiny_drafter, tiny_tokenizer, tiny_verifier

# a verified token costs two plain steps; a drafter call half of one
DEAR_TOKENS = CostProfile({1: 1.0, 2: 3.0, 3: 5.0}, {1: 0.5, 8: 0.5})
# verifying 8 tokens costs 1.2 plain steps (an AVX512-BF16 CPU, a GPU)
CHEAP_TOKENS = CostProfile({1: 1.0, 2: 1.05, 4: 1.1, 8: 1.2, 16: 1.6}, {1: 0.1, 8: 0.1})


@pytest.fixture
def saved_models(tmp_path):
    verifier = tiny_verifier("llama")
    verifier.save_pretrained(tmp_path / "verifier")
    tiny_tokenizer().save_pretrained(tmp_path / "verifier")
    tiny_drafter(verifier, block_size=8).save_pretrained(tmp_path / "drafter")
    return tmp_path


@pytest.fixture
def quiet_machine(monkeypatch):
    """No other process takes cores while profiles are timed (the tests' own parallel workers do)."""
    monkeypatch.setattr(costs_specdiff.CpuContention, "other_cores", lambda self: 0.0)


def test_cost_profile_is_measured_once_per_machine_and_models_then_read_from_disk(monkeypatch, quiet_machine):
    verifier = tiny_verifier("llama")
    drafter = tiny_drafter(verifier, block_size=8)
    profile = cost_profile(verifier, drafter)
    assert sorted(profile.verifier) == list(PROFILE_LENGTHS) and sorted(profile.drafter) == [1, 8]
    assert all(seconds > 0 for seconds in [*profile.verifier.values(), *profile.drafter.values()])
    assert profile.machine["threads"] == torch.get_num_threads()
    directory = Path(costs_specdiff.cost_profile_dir())
    files = os.listdir(directory)
    assert any(CostProfile.from_dict(json.loads((directory / name).read_text())) == profile for name in files)

    monkeypatch.setattr(costs_specdiff, "_PROFILES", {})  # a new process: only the disk remembers
    monkeypatch.setattr(costs_specdiff, "measure_costs", lambda *a, **k: pytest.fail("measured again"))
    assert cost_profile(verifier, drafter) == profile
    with pytest.raises(pytest.fail.Exception, match="measured again"):  # asked afresh (`doctor --measure`)
        cost_profile(verifier, drafter, fresh=True)
    with torch.backends.mkldnn.flags(enabled=False):  # oneDNN switched off by the user: another profile
        assert cost_profile(verifier, drafter, measure=False) is None
    verifier.to(torch.float64)  # another dtype: another profile
    assert cost_profile(verifier, drafter, measure=False) is None
    with pytest.raises(pytest.fail.Exception, match="measured again"):
        cost_profile(verifier, drafter)


def test_a_profile_timed_while_other_processes_took_its_cores_is_used_but_not_kept(monkeypatch, caplog):
    verifier = tiny_verifier("llama")
    drafter = tiny_drafter(verifier, block_size=8)
    monkeypatch.setenv("HF_SPECDIFF_COSTS", str(Path(costs_specdiff.cost_profile_dir()) / "contended"))
    monkeypatch.setattr(costs_specdiff.CpuContention, "other_cores", lambda self: 1.5)
    monkeypatch.setattr(costs_specdiff.CpuContention, "_read", staticmethod(lambda: (0.0, 0.0, 0.0, 2)))
    with caplog.at_level("WARNING"):
        profile = cost_profile(verifier, drafter)
    assert "other processes kept 1.5 cores busy" in caplog.text and "not kept" in caplog.text
    assert cost_profile(verifier, drafter) is profile  # used in this process
    assert not os.path.isdir(costs_specdiff.cost_profile_dir()) or not os.listdir(costs_specdiff.cost_profile_dir())
    monkeypatch.setattr(costs_specdiff, "_PROFILES", {})  # the next process measures again, alone: kept
    monkeypatch.setattr(costs_specdiff.CpuContention, "other_cores", lambda self: 0.1)
    assert cost_profile(verifier, drafter) is not profile and len(os.listdir(costs_specdiff.cost_profile_dir())) == 1


def test_cpu_contention_is_the_cores_other_processes_kept_busy_beyond_those_the_measurement_left_free(monkeypatch):
    readings = iter([(100.0, 10.0, 50.0, 2), (104.0, 13.0, 52.0, 2)])  # (machine busy s, ours s, wall s, CPUs)
    monkeypatch.setattr(costs_specdiff.CpuContention, "_read", staticmethod(lambda: next(readings)))
    two_threads = costs_specdiff.CpuContention(threads=2)
    assert two_threads.other_cores() == pytest.approx(0.5)  # 4 busy seconds in 2, 3 of them ours
    assert two_threads.contended(0.5) and not two_threads.contended(0.2)  # no core was free: 0.25 of slack
    one_thread = costs_specdiff.CpuContention.__new__(costs_specdiff.CpuContention)
    one_thread.threads, one_thread.start = 1, (0.0, 0.0, 0.0, 2)
    assert not one_thread.contended(1.2) and one_thread.contended(1.3)  # one core was free
    assert not one_thread.contended(None)  # unknown (no /proc/stat): kept


def test_a_profile_keeps_each_forwards_fastest_time_so_a_passing_load_does_not_stay_in_it(monkeypatch):
    """Other work on the machine only adds time: a load that slows 3 of each forward's 5 timings (a median would keep
    it) leaves the profile at what the forwards cost on the machine alone."""
    verifier = tiny_verifier("llama")
    clock, forwards = [0.0], []

    def timed_forward(module, args, kwargs, output):
        forwards.append(kwargs["input_ids"].shape[1])
        timed_pass = (len(forwards) - 2) // len(PROFILE_LENGTHS)  # after the context's forward, an untimed pass
        loaded = timed_pass in (1, 2, 3)  # 3 of the 5 timed passes run beside other work
        clock[0] += (1.0 + 0.01 * forwards[-1]) * (3.0 if loaded else 1.0)

    verifier.register_forward_hook(timed_forward, with_kwargs=True)
    monkeypatch.setattr(costs_specdiff, "device_clock", lambda device: clock[0])
    profile = costs_specdiff.measure_costs(verifier)
    assert profile.verifier == pytest.approx({n: 1.0 + 0.01 * n for n in PROFILE_LENGTHS})


def test_outlook_says_where_drafting_pays():
    dear, cheap = Outlook("bf16", DEAR_TOKENS, 8), Outlook("fp32", CHEAP_TOKENS, 8)
    assert dear.best(0.9)[0] == 0 and dear.speedup(0.9) == pytest.approx(1.0)  # even a perfect drafter cannot pay
    assert dear.break_even() is None and dear.break_even(drafted=False) is None
    assert cheap.best(0.5)[0] >= 1 and cheap.speedup(0.9) > 3 and cheap.break_even() < 0.2
    assert cheap.best(0.9, drafted=False)[1] > cheap.best(0.9)[1]  # a lookup draft pays no drafter call
    assert fastest([dear, cheap]) is cheap
    text = report([dear, cheap])
    assert "bf16: from the first round, plain steps" in text
    assert f"fp32: from the first round, the drafter drafts {cheap.best(0.5)[0]} tokens" in text
    assert "--dtype auto picks fp32" in text


def test_doctor_command_prints_the_profile_of_both_dtypes(saved_models, capsys, monkeypatch, quiet_machine):
    from hf_specdiff.tools.cli import main

    command = ["doctor", "--verifier", str(saved_models / "verifier"), "--drafter", str(saved_models / "drafter"),
               "--threads", "1"]
    assert main(command) == 0
    out = capsys.readouterr().out
    assert "1 threads" in out and "--dtype auto picks" in out
    assert all(re.search(rf"{dtype} +{source}", out) for dtype in ("bf16", "fp32") for source in ("drafter", "prompt"))
    measured = []
    monkeypatch.setattr(costs_specdiff, "measure_costs",
                        lambda *args, **kwargs: measured.append(args) or CHEAP_TOKENS)
    assert main(command) == 0 and not measured  # kept
    assert main(command + ["--measure"]) == 0 and len(measured) == 2  # both dtypes timed again
    capsys.readouterr()
    assert main(command) == 0 and len(measured) == 2 and "1.20x" in capsys.readouterr().out  # and kept
    assert main(["doctor", "--drafter", str(saved_models / "missing")]) == 2
    assert "no drafter folder at" in capsys.readouterr().err


def test_demo_picks_a_dtype_runs_its_default_prompts_and_says_what_the_machine_allows(saved_models, capsys):
    from hf_specdiff.tools.demo import DEMO_PROMPTS, run_demo

    results = run_demo(verifier=str(saved_models / "verifier"), drafter=str(saved_models / "drafter"),
                       max_new_tokens=6, threads=1, colour=False)
    out = capsys.readouterr().out
    assert len(results) == len(DEMO_PROMPTS) == out.count("\n> ")
    assert "--dtype auto: " in out and f"total ({len(DEMO_PROMPTS)} prompts)" in out
    assert "this machine (" in out and "a prompt-lookup token" in out


def test_a_drafter_that_drafts_with_the_verifiers_weights_is_paired_before_its_profile_is_measured():
    from helpers import tiny_dflash_drafter

    verifier = tiny_verifier("qwen3")
    drafter = tiny_dflash_drafter(verifier)  # not paired: it cannot draft without the verifier's embeddings and head
    profile = drafter.cost_profile(verifier)
    assert sorted(profile.drafter) == sorted({1, drafter.config.max_draft_tokens}) and drafter.cost_profile() == profile


def test_auto_dtype_loads_each_dtype_once_and_keeps_the_fastest(tmp_path, monkeypatch, capsys):
    import hf_specdiff.tools.doctor as doctor
    from hf_specdiff import SpecDiffDrafter
    from hf_specdiff.tools.doctor import load_fastest

    verifier = tiny_verifier("llama")
    verifier.save_pretrained(tmp_path / "verifier")
    tiny_tokenizer().save_pretrained(tmp_path / "verifier")
    tiny_drafter(verifier, block_size=8).save_pretrained(tmp_path / "drafter")
    loads, load_pair = [], doctor.load_pair
    monkeypatch.setattr(doctor, "load_pair", lambda *args, **kwargs: loads.append(args[2]) or load_pair(*args, **kwargs))
    profiles = {torch.bfloat16: DEAR_TOKENS, torch.float32: CHEAP_TOKENS}  # drafting pays in fp32 only
    monkeypatch.setattr(SpecDiffDrafter, "cost_profile", lambda drafter, model, fresh: profiles[model.dtype])
    model, tokenizer, drafter = load_fastest(str(tmp_path / "verifier"), str(tmp_path / "drafter"), threads=1)
    assert loads == [torch.bfloat16, torch.float32]
    assert model.dtype == drafter.dtype == torch.float32 and tokenizer is not None
    assert "--dtype auto: fp32" in capsys.readouterr().out


# a CPU where a bf16 forward over 1 or 2 new tokens runs faster without oneDNN (an AVX512-BF16 CPU without AMX)
KERNEL_CHOICE = CostProfile({1: 1.0, 2: 1.5, 4: 2.0, 8: 2.2}, {1: 0.1, 8: 0.1}, onednn_from=3,
                            torch_kernels={1: 2.0, 2: 2.0, 4: 2.0, 8: 2.2})
needs_onednn = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN")


@needs_onednn
def test_the_profile_times_bf16_forwards_with_and_without_onednn_and_keeps_the_faster_for_each_length(monkeypatch):
    """Without oneDNN a forward costs 0.5 + 0.5 n here, with it 2 + 0.01 n: 1 and 2 new tokens run faster without it
    (3 by less than noise)."""
    verifier = tiny_verifier("llama", dtype=torch.bfloat16)
    clock, runs = [0.0], []

    def timed_forward(module, args, kwargs, output):
        n, onednn = kwargs["input_ids"].shape[1], torch.backends.mkldnn.enabled
        runs.append((n, onednn))
        clock[0] += 2.0 + 0.01 * n if onednn else 0.5 + 0.5 * n

    verifier.register_forward_hook(timed_forward, with_kwargs=True)
    monkeypatch.setattr(costs_specdiff, "device_clock", lambda device: clock[0])
    monkeypatch.setattr(costs_specdiff, "onednn_has_kernels", lambda dtype: True)  # whatever this CPU has
    profile = costs_specdiff.measure_costs(verifier)
    assert torch.backends.mkldnn.enabled  # as it was
    assert profile.onednn_from == 3 and profile.plain_step == pytest.approx(1.0)
    assert profile.torch_plain_step == pytest.approx(2.01)
    assert profile.verifier == pytest.approx({n: 0.5 + 0.5 * n if n < 3 else 2.0 + 0.01 * n for n in PROFILE_LENGTHS})
    assert CostProfile.from_dict(json.loads(json.dumps(profile.to_dict()))) == profile  # kept as it was measured

    verifier = tiny_verifier("llama")  # fp32 products never use oneDNN: timed once, as torch runs them
    verifier.register_forward_hook(timed_forward, with_kwargs=True)
    runs.clear()
    profile = costs_specdiff.measure_costs(verifier)
    assert profile.onednn_from is None and profile.torch_kernels == {} and all(onednn for _, onednn in runs)

    verifier = tiny_verifier("llama", dtype=torch.bfloat16)  # a CPU where oneDNN has no bf16 products (AVX2 only)
    verifier.register_forward_hook(timed_forward, with_kwargs=True)
    monkeypatch.setattr(costs_specdiff, "onednn_has_kernels", lambda dtype: False)
    runs.clear()
    profile = costs_specdiff.measure_costs(verifier)
    assert profile.onednn_from is None and profile.torch_kernels == {} and all(onednn for _, onednn in runs)


def test_kernels_are_chosen_only_where_they_are_faster_by_more_than_noise():
    with_onednn = {1: 2.0, 2: 2.0, 4: 2.0, 8: 2.2}
    assert costs_specdiff._onednn_from(with_onednn, {1: 1.0, 2: 1.95, 4: 3.0, 8: 5.0}) == 2
    assert costs_specdiff._onednn_from(with_onednn, {1: 1.0, 2: 2.1, 4: 1.5, 8: 5.0}) == 8  # faster again at 4
    assert costs_specdiff._onednn_from(with_onednn, {n: 0.97 * t for n, t in with_onednn.items()}) is None  # noise
    assert costs_specdiff._onednn_from(with_onednn, {n: 0.5 * t for n, t in with_onednn.items()}) == 9  # always
    # a plain step as fast with oneDNN: kept, whatever one longer forward's noise says (an AVX2-only EPYC's timings)
    measured = {1: 37.8, 2: 60.8, 4: 87.6, 8: 145.7, 16: 261.0, 20: 347.7}
    assert costs_specdiff._onednn_from(measured, {1: 38.0, 2: 59.1, 4: 89.9, 8: 141.7, 16: 259.5, 20: 330.5}) is None


@needs_onednn
def test_specdiff_generate_runs_verifier_forwards_over_few_tokens_without_onednn_and_restores_it():
    from hf_specdiff import generate

    verifier = tiny_verifier("llama", dtype=torch.bfloat16)
    drafter = tiny_drafter(verifier, block_size=8).to(torch.bfloat16)
    seen = []
    verifier.model.register_forward_pre_hook(
        lambda module, args, kwargs: seen.append((kwargs["input_ids"].shape[1], torch.backends.mkldnn.enabled)),
        with_kwargs=True)
    prompt = torch.tensor([[5, 9, 20, 7, 5, 9, 20, 7]])
    cheap_with_kernels = dataclasses.replace(CHEAP_TOKENS, onednn_from=2)  # drafting pays: forwards of 1, 2, more
    out = generate(verifier, drafter, input_ids=prompt, max_new_tokens=12, do_sample=False, num_drafts=2,
                   lookup_tokens=4, cost_profile=cheap_with_kernels)
    assert out.shape[1] > prompt.shape[1] and torch.backends.mkldnn.enabled
    assert {min(n, 3) for n, _ in seen} == {1, 2, 3}  # forwards below, at and above the threshold
    assert all(onednn == (n >= 2) for n, onednn in seen)
    seen.clear()
    generate(verifier, drafter, input_ids=prompt, max_new_tokens=12, do_sample=False, cost_profile=CHEAP_TOKENS)
    assert all(onednn for _, onednn in seen)  # a profile that chose no kernels changes none
    with pytest.raises(RuntimeError, match="boom"):  # a forward that fails leaves oneDNN as it was
        with KERNEL_CHOICE.verifier_kernels(verifier):
            verifier.model.register_forward_hook(lambda *_: (_ for _ in ()).throw(RuntimeError("boom")))
            verifier(input_ids=prompt[:, :1])
    assert torch.backends.mkldnn.enabled


def test_the_doctor_says_what_the_kernel_choice_gains_and_how_a_users_own_calls_get_it():
    text = report([Outlook("bf16", KERNEL_CHOICE, 8), Outlook("fp32", CHEAP_TOKENS, 8)])
    assert "bf16: verifier forwards over fewer than 3 new tokens run faster without oneDNN here (a plain step " \
           "1000.0 ms against 2000.0 ms" in text and "the same 2.00x" in text and "verifier_kernels(model)" in text
    assert "fp32: verifier forwards" not in text
    assert "oneDNN" not in report([Outlook("fp32", CHEAP_TOKENS, 8)])


@needs_onednn
def test_the_drop_in_path_runs_each_verification_forward_with_the_profiles_kernels_and_leaves_no_hook(monkeypatch):
    verifier = tiny_verifier("llama", dtype=torch.bfloat16)
    drafter = tiny_drafter(verifier, block_size=8).to(torch.bfloat16).attach(verifier)
    events, hooks = [], (len(verifier._forward_pre_hooks), len(verifier._forward_hooks))
    arm = costs_specdiff.VerifierKernels.next_forward
    monkeypatch.setattr(costs_specdiff.VerifierKernels, "next_forward", lambda self: events.append("drafted") or arm(self))
    verifier.model.register_forward_pre_hook(
        lambda module, args, kwargs: events.append((kwargs["input_ids"].shape[1], torch.backends.mkldnn.enabled)),
        with_kwargs=True)
    prompt = torch.tensor([[5, 9, 20, 7, 5, 9, 20, 7]])
    for profile in (DEAR_TOKENS, CHEAP_TOKENS):  # plain steps, then drafts
        costs_specdiff.set_cost_profile(verifier, drafter, dataclasses.replace(profile, onednn_from=2))
        verifier.generate(prompt, max_new_tokens=16, do_sample=False, assistant_model=drafter)
        assert (len(verifier._forward_pre_hooks), len(verifier._forward_hooks)) == hooks
        assert torch.backends.mkldnn.enabled
    # the forwards right after a drafter call (transformers' loop also runs a last plain forward without one)
    verifications = [event for before, event in zip(events, events[1:]) if before == "drafted"]
    assert {min(n, 2) for n, _ in verifications} == {1, 2}  # plain steps and drafts
    assert all(onednn == (n >= 2) for n, onednn in verifications)


def test_the_demo_compares_with_plain_under_the_same_kernels_where_the_profile_chose_them(saved_models, capsys,
                                                                                          monkeypatch):
    from hf_specdiff import SpecDiffDrafter
    from hf_specdiff.tools.demo import run_demo

    chosen = dataclasses.replace(CHEAP_TOKENS, onednn_from=2, torch_kernels={1: 2.0, 16: 3.2})
    monkeypatch.setattr(SpecDiffDrafter, "cost_profile", lambda drafter, model=None, **kwargs: chosen)
    results = run_demo(["t5 t9 t20", "t7 t8"], verifier=str(saved_models / "verifier"),
                       drafter=str(saved_models / "drafter"), dtype="bf16", max_new_tokens=6, threads=1, colour=False)
    out = capsys.readouterr().out
    assert out.count("  plain with SpecDiff's kernels ") == 2 and "plain with SpecDiff's kernels" in out.split("total")[1]
    assert all(r["plain_kernels_tokens"] > 0 and r["speedup_over_plain_kernels"] > 0 for r in results)
    monkeypatch.setattr(SpecDiffDrafter, "cost_profile", lambda drafter, model=None, **kwargs: CHEAP_TOKENS)
    assert "SpecDiff's kernels" not in (run_demo("t5 t9", verifier=str(saved_models / "verifier"),
                                                 drafter=str(saved_models / "drafter"), dtype="bf16",
                                                 max_new_tokens=6, threads=1, colour=False) and capsys.readouterr().out)


needs_packing = pytest.mark.skipif(not costs_specdiff.PackedLinears.apply_to(tiny_verifier("llama")),
                                   reason="oneDNN cannot pack fp32 linear weights here")


def _packed(verifier) -> bool:
    return all("forward" in m.__dict__ for m in verifier.modules() if isinstance(m, torch.nn.Linear))


def _forwards_packed(verifier) -> list[tuple[int, bool]]:
    """A list that gets (new tokens, whether the layers ran packed) of each verifier forward from now on."""
    seen = []
    verifier.model.register_forward_pre_hook(
        lambda module, args, kwargs: seen.append((kwargs["input_ids"].shape[1], _packed(verifier))), with_kwargs=True)
    return seen


@needs_packing
def test_packed_linears_give_torchs_logits_follow_a_changed_weight_and_are_taken_off():
    verifier = tiny_verifier("llama")
    ids = torch.tensor([[5, 9, 20, 7, 5, 9]])
    packed = costs_specdiff.PackedLinears(verifier)
    for _ in range(2):
        stock = verifier(input_ids=ids).logits
        packed.use()
        assert _packed(verifier)
        torch.testing.assert_close(verifier(input_ids=ids).logits, stock, atol=1e-5, rtol=1e-4)
        packed.restore()
        assert not any("forward" in m.__dict__ for m in verifier.modules())
        with torch.no_grad():  # a weight changed in place: packed again, not the stale copy
            verifier.model.layers[0].mlp.down_proj.weight.mul_(3)
        packed = costs_specdiff.PackedLinears(verifier)


def test_packing_applies_only_to_plain_cpu_linear_layers_in_a_dtype_onednn_packs(monkeypatch):
    verifier = tiny_verifier("llama")
    key = costs_specdiff._cost_key(verifier, None)
    monkeypatch.setenv("HF_SPECDIFF_PACKED_WEIGHTS", "0")  # the user's choice: torch's kernels, a profile of their own
    assert not costs_specdiff.PackedLinears.apply_to(verifier) and costs_specdiff._cost_key(verifier, None) != key
    monkeypatch.delenv("HF_SPECDIFF_PACKED_WEIGHTS")
    assert costs_specdiff._cost_key(verifier, None) == key
    verifier.model.layers[0].mlp.up_proj.forward = lambda x: x  # wrapped by another library (offloading, adapters)
    assert not costs_specdiff.PackedLinears.apply_to(verifier)
    try:
        torch.ops.mkldnn._reorder_linear_weight(torch.zeros(8, 8, dtype=torch.bfloat16), 4)
    except (RuntimeError, AttributeError):  # an AVX2-only CPU: oneDNN has no bf16 products to pack for
        assert not costs_specdiff.PackedLinears.apply_to(tiny_verifier("llama", dtype=torch.bfloat16))


def test_weights_are_packed_only_from_where_every_longer_forward_is_faster_by_more_than_noise():
    unpacked = {1: 55.0, 2: 93.0, 4: 94.0, 8: 92.0, 16: 108.0}  # fp32 on an AVX2-only EPYC, ms
    assert costs_specdiff._packed_from(unpacked, {1: 54.0, 2: 60.0, 4: 63.0, 8: 80.0, 16: 89.0}) == 2
    assert costs_specdiff._packed_from(unpacked, {1: 50.0, 2: 60.0, 4: 63.0, 8: 80.0, 16: 89.0}) == 1
    assert costs_specdiff._packed_from(unpacked, {1: 50.0, 2: 60.0, 4: 93.0, 8: 80.0, 16: 89.0}) == 8  # not at 4
    assert costs_specdiff._packed_from(unpacked, {1: 50.0, 2: 60.0, 4: 63.0, 8: 80.0, 16: 105.0}) is None  # noise


@needs_packing
def test_the_profile_times_forwards_with_packed_weights_and_keeps_them_where_faster(monkeypatch):
    """Packed, a forward costs 1 + 0.01 n here, as torch runs it 1 + 0.5 n: packed from 1 new token on."""
    verifier = tiny_verifier("llama")
    clock = [0.0]
    verifier.register_forward_hook(lambda module, args, kwargs, output: clock.__setitem__(
        0, clock[0] + 1.0 + (0.01 if _packed(verifier) else 0.5) * kwargs["input_ids"].shape[1]), with_kwargs=True)
    monkeypatch.setattr(costs_specdiff, "device_clock", lambda device: clock[0])
    profile = costs_specdiff.measure_costs(verifier)
    assert profile.packed_from == 1 and profile.onednn_from is None and not _packed(verifier)
    assert profile.verifier == pytest.approx({n: 1.0 + 0.01 * n for n in PROFILE_LENGTHS})
    assert profile.torch_kernels == pytest.approx({n: 1.0 + 0.5 * n for n in PROFILE_LENGTHS})
    assert CostProfile.from_dict(json.loads(json.dumps(profile.to_dict()))) == profile
    assert "verifier forwards run faster with their linear weights packed for oneDNN" in profile.kernels_chosen()
    clock[0], verifier = 0.0, tiny_verifier("llama")  # where packing is no faster, no packed copy is kept
    verifier.register_forward_hook(lambda module, args, kwargs, output: clock.__setitem__(
        0, clock[0] + 1.0 + 0.5 * kwargs["input_ids"].shape[1]), with_kwargs=True)
    assert costs_specdiff.measure_costs(verifier).packed_from is None
    linears = [m for m in verifier.modules() if isinstance(m, torch.nn.Linear)]
    assert not any(m in costs_specdiff.PackedLinears._kept for m in linears)


@needs_packing
def test_specdiff_generate_verifies_with_packed_weights_from_the_profiles_threshold_as_plain_greedy_decodes():
    from hf_specdiff import generate

    verifier = tiny_verifier("llama")
    drafter = tiny_drafter(verifier, block_size=8)
    seen = _forwards_packed(verifier)
    prompt = torch.tensor([[5, 9, 20, 7, 5, 9, 20, 7]])
    plain = verifier.generate(prompt, max_new_tokens=24, do_sample=False)
    seen.clear()
    out = generate(verifier, drafter, input_ids=prompt, max_new_tokens=24, do_sample=False, num_drafts=2,
                   lookup_tokens=4, cost_profile=dataclasses.replace(CHEAP_TOKENS, packed_from=2))
    assert torch.equal(out, plain)
    assert {min(n, 2) for n, _ in seen} == {1, 2} and all(packed == (n >= 2) for n, packed in seen)
    assert not _packed(verifier)


@needs_packing
def test_the_drop_in_path_verifies_with_packed_weights_as_plain_greedy_decodes_and_takes_them_off():
    verifier = tiny_verifier("llama")
    drafter = tiny_drafter(verifier, block_size=8).attach(verifier)
    seen = _forwards_packed(verifier)
    prompt = torch.tensor([[5, 9, 20, 7, 5, 9, 20, 7]])
    plain = verifier.generate(prompt, max_new_tokens=16, do_sample=False)
    seen.clear()
    costs_specdiff.set_cost_profile(verifier, drafter, dataclasses.replace(CHEAP_TOKENS, packed_from=2))
    out = verifier.generate(prompt, max_new_tokens=16, do_sample=False, assistant_model=drafter)
    assert torch.equal(out, plain) and not _packed(verifier)
    assert any(n >= 2 and packed for n, packed in seen) and all(not packed for n, packed in seen if n < 2)
