"""`hf-specdiff demo`: stream answers with SpecDiff decoding, the drafter's accepted tokens marked, then compare
each with plain greedy decoding, and say what this machine's costs let drafting gain."""

import sys

import torch

from ..decoding import SpecDiffStats, generate
from ..costs_specdiff import CostProfile, cost_profile_dir, device_clock
from .doctor import DTYPES, Outlook, load_fastest
from .threads import torch_threads
from .verifiers import DEFAULT_VERIFIER, load_pair

DRAFTED_COLOUR, RESET = "\033[32m", "\033[0m"
# the default prompts: requests of different kinds, from ones that copy their context to an open question
DEMO_PROMPTS = [
    "Rename the variable `x` to `total` in this Python function and show the whole function:\n\n"
    "def add_prices(items):\n    x = 0\n    for item in items:\n        if item.price > 0:\n"
    "            x = x + item.price\n    return x",
    "List every city in this passage with its country, one per line:\n\nThe tour started in Lyon, France, went on "
    "to Turin in Italy and to Geneva, Switzerland, and ended in Munich, Germany, after a rest day in Innsbruck, "
    "Austria.",
    "Summarize this in one sentence:\n\nThe library's reading room will close for renovation from March to June. "
    "During that time, books can still be borrowed at the front desk, and study space is available on the second "
    "floor. The renovated room will have more seats, better lighting and power outlets at every table.",
    "Explain speculative decoding in two sentences.",
]


class DraftMarkingStreamer:
    """Prints the answer as it is decoded, marking the tokens the drafter proposed and the verifier accepted.

    Each `put` after the prompt is one verification round: its tokens are the accepted draft tokens and then the
    verifier's own next token. Drafted text is green on a terminal and in [brackets] elsewhere.
    """

    def __init__(self, tokenizer, colour: bool, out=None):
        self.tokenizer, self.colour, self.out = tokenizer, colour, out or sys.stdout
        self.tokens: list[int] = []
        self.shown = ""
        self.prompt_seen = False

    def _text(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=True)

    def _mark(self, text: str) -> str:
        body = text.lstrip()
        if not body:
            return text
        lead = text[:len(text) - len(body)]  # the space before a word stays outside the mark
        return lead + (f"{DRAFTED_COLOUR}{body}{RESET}" if self.colour else f"[{body}]")

    def put(self, value):
        if not self.prompt_seen:  # the first put is the prompt, as in transformers' streamers
            self.prompt_seen = True
            return
        new = value.flatten().tolist()
        drafted = self._text(self.tokens + new[:-1])
        self.tokens += new
        full = self._text(self.tokens)
        if full.endswith("\ufffd"):  # an incomplete character: wait for the next round
            return
        cut = max(len(self.shown), min(len(drafted), len(full)))
        self.out.write(self._mark(full[len(self.shown):cut]) + full[cut:])
        self.out.flush()
        self.shown = full

    def end(self):
        self.out.write("\n")
        self.out.flush()


def run_demo(prompts: str | list[str] | None = None, verifier: str = DEFAULT_VERIFIER, drafter: str | None = None,
             num_drafts: int = 4, lookup_tokens: int = 10, max_new_tokens: int = 128, dtype="auto",
             threads: int | None = 2, colour: bool | None = None) -> list[dict]:
    """Stream SpecDiff's answer to each prompt (None: `DEMO_PROMPTS`) with its drafted tokens marked, time it and
    plain greedy on the same input (each the faster of two interleaved runs), print and return the comparisons,
    then the total and what this machine's cost profile lets drafting gain. `dtype`: "auto" (the faster on this
    machine's profile), "bf16", "fp32" or a torch dtype.
    `threads` applies to this call only; `colour=None` colours on a terminal."""
    prompts = DEMO_PROMPTS if prompts is None else [prompts] if isinstance(prompts, str) else list(prompts)
    if not prompts:
        raise ValueError("no prompts given")
    colour = sys.stdout.isatty() if colour is None else colour
    with torch_threads(threads):
        if dtype == "auto":
            model, tokenizer, draft_model = load_fastest(verifier, drafter, threads=None)
        else:
            model, tokenizer, draft_model = load_pair(verifier, drafter, DTYPES.get(dtype, dtype))
        print("drafted by the drafter and accepted by the verifier: " +
              (f"{DRAFTED_COLOUR}green{RESET}" if colour else "[in brackets]") + "; the rest: the verifier's own")
        profile = draft_model.cost_profile(model)
        kernels = profile if profile is not None and profile.chooses_kernels else None
        results = [_compare(model, tokenizer, draft_model, prompt, dict(num_drafts=num_drafts,
                                                                        lookup_tokens=lookup_tokens),
                            max_new_tokens, colour, kernels) for prompt in prompts]
        _print_total(results, model.dtype, profile)
        _print_outlook(Outlook(str(model.dtype).removeprefix("torch."), profile, draft_model.config.max_draft_tokens))
        note = speed_change_note(profile, sum(r["plain_s"] - r["prompt_s"] for r in results) /
                                 sum(max(r["tokens"] - 1, 1) for r in results))
        if note:
            print(note)
        return results


def speed_change_note(profile: CostProfile, plain_seconds_per_step: float, threshold: float = 1.5) -> str | None:
    """What to tell the user when plain decoding's steps (its forward over the prompt left out) ran here at least
    `threshold` times slower or faster than the cost profile's plain step: the machine was busier or quieter when its
    costs were measured. Each generation rescales the profile by what its rounds measure, but `--dtype auto` chose
    the dtype from the profile alone. (Not per token: on an AVX2-only EPYC the bf16 forward over an 81-token prompt
    took 1.0 s, a sixth of a 128-token answer, and made steps of 39 ms look like 56 ms a token.)"""
    ratio = plain_seconds_per_step / profile.torch_plain_step  # plain `generate` runs with torch's kernels
    if 1 / threshold < ratio < threshold:
        return None
    return (f"note: plain decoding took {1000 * plain_seconds_per_step:.1f} ms a step here, {ratio:.1f}x this "
            f"machine's cost profile ({1000 * profile.torch_plain_step:.1f} ms a step): the machine was "
            f"{'quieter' if ratio > 1 else 'busier'} when its costs were measured. Each generation rescales them by "
            "what it measures, but the dtype was chosen from them; to measure them again, delete "
            f"{cost_profile_dir()}.")


def _print_total(results: list[dict], dtype: torch.dtype, profile: CostProfile):
    if len(results) < 2:
        return
    plain = sum(r["tokens"] for r in results) / sum(r["plain_s"] for r in results)
    fast = sum(r["specdiff_tokens"] for r in results) / sum(r["specdiff_s"] for r in results)
    identical = sum(r["identical"] for r in results)
    print(f"\ntotal ({len(results)} prompts): plain {plain:.1f} tok/s | SpecDiff-2 {fast:.1f} tok/s | speed-up "
          f"{fast / plain:.2f}x | identical to plain greedy: {identical} of {len(results)}" +
          ("" if dtype == torch.float32 else " (bf16: see above)"))
    if all("plain_kernels_tok_s" in r for r in results):
        kernels = sum(r["plain_kernels_tokens"] for r in results) / sum(r["plain_kernels_s"] for r in results)
        print(f"plain with SpecDiff's kernels {kernels:.1f} tok/s ({kernels / plain:.2f}x plain): SpecDiff-2 "
              f"{fast / kernels:.2f}x that. On this machine {profile.kernels_chosen()}, and SpecDiff's loop runs "
              "them so; `hf-specdiff doctor` says how your own calls get that.")


def _print_outlook(outlook: Outlook):
    """What this machine's costs let drafting gain: where drafting cannot pay, the demo says so, and why."""
    profile = outlook.profile
    two = float(profile.verifier_seconds(torch.tensor([2.0]))[0]) / profile.plain_step
    drafter_ms = 1000 * float(profile.drafter_seconds(torch.tensor([1.0]))[0])
    drafter_even, lookup_even = outlook.break_even(), outlook.break_even(drafted=False)
    print(f"this machine ({outlook.dtype_name}): a plain step {1000 * profile.plain_step:.1f} ms; verifying 1 drafted "
          f"token with it costs {two:.2f}x a plain step, a drafter call {drafter_ms:.1f} ms more. So a drafter's "
          "token pays " + (f"where it is accepted at least {drafter_even:.0%} of the time" if drafter_even else
                           "not even where it is accepted 95% of the time") +
          ", a prompt-lookup token " + (f"at {lookup_even:.0%}" if lookup_even else "not even at 95%") +
          "; where neither does, SpecDiff takes plain steps (never much slower than plain). `hf-specdiff doctor` "
          "says more.")


class PromptForwardTimer:
    """While active, `seconds` is the time of `model`'s first forward: a generation's pass over the prompt."""

    def __init__(self, model):
        self.model, self.seconds, self.started = model, None, None

    def __enter__(self):
        self.hooks = [self.model.register_forward_pre_hook(self._start), self.model.register_forward_hook(self._stop)]
        return self

    def _start(self, *_):
        if self.started is None:
            self.started = device_clock(self.model.device)

    def _stop(self, *_):
        if self.seconds is None:
            self.seconds = device_clock(self.model.device) - self.started

    def __exit__(self, *exc):
        for hook in self.hooks:
            hook.remove()


def _timed(model, call) -> tuple:
    """(what `call()` returns, its seconds once the device has finished)."""
    start = device_clock(model.device)
    out = call()
    return out, device_clock(model.device) - start


def _compare(model, tokenizer, draft_model, prompt: str | list, options: dict, max_new_tokens: int,
             colour: bool, kernels: CostProfile | None = None) -> dict:
    """SpecDiff and plain greedy on one prompt, printed and returned; with `kernels` (a profile that runs some
    forwards with other kernels than torch's default, as the SpecDiff loop does), plain greedy with them too."""
    messages = prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]  # a chat, or one request
    inputs = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    prompt = messages[-1]["content"]
    prompt_len = inputs["input_ids"].shape[1]
    kwargs = dict(max_new_tokens=max_new_tokens, do_sample=False)
    # One short untimed run of each first, so neither timed run pays one-time start-up costs.
    generate(model, draft_model, **inputs, **options, max_new_tokens=4, do_sample=False)
    model.generate(**inputs, max_new_tokens=4, do_sample=False)

    print(f"\n> {prompt}")
    stats = SpecDiffStats()
    fast, streamed_s = _timed(model, lambda: generate(model, draft_model, **inputs, **options, stats=stats,
                                                      streamer=DraftMarkingStreamer(tokenizer, colour), **kwargs))
    # Each method twice, interleaved (SpecDiff, plain, plain, SpecDiff without the streamer's printing), the faster
    # run of each kept: noise from other work on the machine only ever adds time.
    with PromptForwardTimer(model) as first:
        plain, plain_s = _timed(model, lambda: model.generate(**inputs, **kwargs))
    with PromptForwardTimer(model) as second:
        plain_s = min(plain_s, _timed(model, lambda: model.generate(**inputs, **kwargs))[1])
    fast_s = min(streamed_s, _timed(model, lambda: generate(model, draft_model, **inputs, **options, **kwargs))[1])

    result = {"prompt": prompt, "plain_tok_s": (plain.shape[1] - prompt_len) / plain_s,
              "specdiff_tok_s": (fast.shape[1] - prompt_len) / fast_s, "tau": stats.tau,
              "tokens": plain.shape[1] - prompt_len, "plain_s": plain_s, "prompt_s": min(first.seconds, second.seconds),
              "specdiff_tokens": fast.shape[1] - prompt_len,
              "specdiff_s": fast_s,
              "identical": fast.tolist() == plain.tolist(), **options, "dtype": str(model.dtype)}
    result["speedup"] = result["specdiff_tok_s"] / result["plain_tok_s"]
    method = f"SpecDiff-2 (K={options['num_drafts']}" + (
        f", lookup {options['lookup_tokens']})" if options["lookup_tokens"] else ")")
    exact_note = "" if result["identical"] or model.dtype == torch.float32 else \
        " (bf16 verification rounds differently from single steps; use --dtype fp32 for exact equality)"
    print(f"plain {result['plain_tok_s']:.1f} tok/s | {method} {result['specdiff_tok_s']:.1f} tok/s"
          f" | speed-up {result['speedup']:.2f}x | tau {stats.tau:.2f} | identical to plain greedy: "
          f"{result['identical']}{exact_note}")
    if kernels is not None:
        result.update(_plain_with_kernels(model, inputs, kwargs, kernels))
        result["speedup_over_plain_kernels"] = result["specdiff_tok_s"] / result["plain_kernels_tok_s"]
        print(f"  plain with SpecDiff's kernels {result['plain_kernels_tok_s']:.1f} tok/s: SpecDiff-2 "
              f"{result['speedup_over_plain_kernels']:.2f}x that")
    return result


def _plain_with_kernels(model, inputs: dict, kwargs: dict, kernels: CostProfile) -> dict:
    """Plain greedy under `kernels`' choice of kernels, the faster of two runs: its tokens, seconds and rate (in bf16
    its text may differ from plain's, so it counts its own tokens)."""
    with kernels.verifier_kernels(model):
        runs = [_timed(model, lambda: model.generate(**inputs, **kwargs)) for _ in range(2)]
    tokens, seconds = max(((out.shape[1] - inputs["input_ids"].shape[1], s) for out, s in runs),
                          key=lambda run: run[0] / run[1])
    return {"plain_kernels_tokens": tokens, "plain_kernels_s": seconds, "plain_kernels_tok_s": tokens / seconds}
