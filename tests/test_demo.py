"""The demo shows the drafting, and library calls leave torch's thread count as they found it."""

import io

import torch

from hf_specdiff.tools.bench import benchmark
from hf_specdiff.costs_specdiff import CostProfile
from hf_specdiff.tools import demo
from hf_specdiff.tools.demo import DraftMarkingStreamer, PromptForwardTimer, run_demo, speed_change_note
from hf_specdiff.training.evaluate import evaluate_drafter
from helpers import greedy_sequences, tiny_drafter, tiny_tokenizer, tiny_verifier, train_briefly

PROMPTS = torch.randint(4, 96, (16, 5), generator=torch.Generator().manual_seed(6))


def test_streamer_marks_accepted_draft_tokens():
    for colour, expected in ((False, "[t5 t6] t7 t8 [t9] t10\n"), (True, "\033[32mt5 t6\033[0m t7 t8 \033[32mt9\033[0m t10\n")):
        out = io.StringIO()
        streamer = DraftMarkingStreamer(tiny_tokenizer(), colour=colour, out=out)
        streamer.put(torch.tensor([[4, 4, 4]]))  # the prompt: not shown
        for round_tokens in ([5, 6, 7], [8], [9, 10]):  # each round: accepted draft tokens, then the verifier's
            streamer.put(torch.tensor([round_tokens]))
        streamer.end()
        assert out.getvalue() == expected


def test_demo_says_when_the_machine_runs_at_another_speed_than_its_cost_profile(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_SPECDIFF_COSTS", str(tmp_path / "costs"))
    profile = CostProfile({1: 0.030, 2: 0.032})
    assert speed_change_note(profile, 0.040) is None and speed_change_note(profile, 0.021) is None
    slower, faster = speed_change_note(profile, 0.060), speed_change_note(profile, 0.015)
    assert "60.0 ms a step here, 2.0x" in slower and "was quieter when" in slower and str(tmp_path / "costs") in slower
    assert "0.5x" in faster and "was busier when" in faster
    kernels = CostProfile({1: 0.030, 2: 0.032}, onednn_from=2, torch_kernels={1: 0.060, 2: 0.061})
    assert speed_change_note(kernels, 0.060) is None  # plain `generate` runs with torch's kernels: as measured
    assert "0.5x" in speed_change_note(kernels, 0.030) and "60.0 ms a step" in speed_change_note(kernels, 0.030)


def test_the_demo_prices_plain_steps_without_the_forward_over_the_prompt(monkeypatch):
    """A forward over n tokens takes n seconds on this clock: the prompt's forward (5 tokens) is timed alone, so a
    plain step is told apart from a prompt that costs a sixth of an answer (bf16 on an AVX2-only CPU)."""
    verifier = tiny_verifier("llama")
    clock = [0.0]
    verifier.register_forward_hook(lambda module, args, kwargs, output: clock.__setitem__(
        0, clock[0] + kwargs["input_ids"].shape[1]), with_kwargs=True)  # runs before the timer's, which come later
    monkeypatch.setattr(demo, "device_clock", lambda device: clock[0])
    with PromptForwardTimer(verifier) as first:
        verifier.generate(PROMPTS[:1], max_new_tokens=4, min_new_tokens=4, do_sample=False)
    assert first.seconds == 5.0 and clock[0] == 5.0 + 3
    hooks = (len(verifier._forward_pre_hooks), len(verifier._forward_hooks))
    assert hooks == (0, 1)  # the timer's hooks are gone, the clock's stays


def thread_counts(model) -> set:
    seen = set()
    model.register_forward_pre_hook(lambda *_: seen.add(torch.get_num_threads()))
    return seen


def test_library_calls_pin_threads_for_the_call_only(tmp_path, capsys):
    verifier, tokenizer = tiny_verifier("llama"), tiny_tokenizer()
    drafter = train_briefly(tiny_drafter(verifier, block_size=8), greedy_sequences(verifier, PROMPTS, 40), steps=80)
    verifier.save_pretrained(tmp_path / "verifier")
    tokenizer.save_pretrained(tmp_path / "verifier")
    drafter.save_pretrained(tmp_path / "drafter")
    torch.set_num_threads(2)

    chat = [{"role": "user", "content": "t7 t8"}]  # a jsonl row's `messages`
    results = run_demo(["t5 t9 t14", chat], verifier=str(tmp_path / "verifier"), drafter=str(tmp_path / "drafter"),
                       max_new_tokens=20, dtype=torch.float32, threads=1, colour=False)
    out = capsys.readouterr().out
    assert [r["identical"] for r in results] == [True, True] and "[" in out and out.count("speed-up") == 3  # each prompt, then the total
    assert torch.get_num_threads() == 2
    assert all(0 < r["prompt_s"] < r["plain_s"] for r in results)  # the prompt's forward, which the note leaves out

    seen = thread_counts(verifier)
    benchmark(verifier, tokenizer, [{"category": "qa", "prompt": "t5 t9"}], drafter=drafter, max_new_tokens=8,
              progress=False, threads=1)
    assert seen == {1} and torch.get_num_threads() == 2
    seen.clear()
    evaluate_drafter(verifier, tokenizer, drafter, ["t5 t9"], max_new_tokens=8, progress=False, threads=1)
    assert seen == {1} and torch.get_num_threads() == 2
