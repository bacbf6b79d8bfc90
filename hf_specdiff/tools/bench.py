"""`hf-specdiff bench`: every method on the same Spec-Bench prompts, interleaved per prompt, in one process.

Methods: plain greedy `generate` (and once more, `PLAIN_AGAIN`: the noise floor), prompt-lookup decoding, an
autoregressive drafter (transformers' own `assistant_model` path), SpecDiff (an unaligned MDLM drafter), SpecDiff-2
(the aligned drafter, also through the drop-in `assistant_model=` path with its adaptive draft length), SpecDiff-2
conditioned (a drafter that reads the verifier's hidden states), each drafter at every K asked for (K=1: one draft;
K>1: self-selection) and, on request, with a prompt-lookup branch in its tree ("+ lookup"). Per
category and overall: tokens/s, speed-up over plain, tau (tokens per verifier forward), acceptance by draft
position (SpecDiff methods), exact match with plain greedy, and the drafter's cost: milliseconds per drafter
forward next to milliseconds per verifier forward. Where the machine's cost profile runs some verifier forwards
with other kernels than torch's default, plain `generate` runs with them too (`PLAIN_WITH_KERNELS`). Writes
results.json, results.md and PNG plots.

A long run loses nothing on a crash: each finished prompt's records go to a JSON-lines file as they come, and a
rerun with the same settings resumes after the last finished prompt.
"""

import hashlib
import json
import resource
import time
from collections import defaultdict
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ..decoding import DEFAULT_NUM_LOOKUP_DRAFTS, SpecDiffStats, generate
from ..costs_specdiff import device_clock
from ..training.evaluate import plot_acceptance
from .threads import torch_threads

# plain `generate` with the kernels the SpecDiff loop runs each forward with (`CostProfile.verifier_kernels`); run
# beside plain where a cost profile chose other kernels than torch's default (bf16 on an AVX512-BF16 CPU: a plain
# step 23 ms against 40 ms), so that a speed-up the kernels bring is not read as the drafter's
PLAIN_WITH_KERNELS = "plain, SpecDiff's kernels"
# plain `generate` once more, interleaved with the others like any method: the run's noise floor, the speed-up
# plain shows over itself (on a 2-core KVM EPYC, the fastest of 3 runs per prompt: 0.92x-1.03x by category,
# 0.89x-1.09x by prompt)
PLAIN_AGAIN = "plain again"

def read_spec_bench(path, per_category: int) -> list[dict]:
    """The first `per_category` questions of each category (first turn only)."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"no prompts file at {path} (a Spec-Bench question.jsonl, or jsonl rows with "
                                "category and turns)")
    rows, seen = [], defaultdict(int)
    for line in Path(path).read_text().splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        category = row.get("category", "all")
        if seen[category] < per_category:
            seen[category] += 1
            rows.append({"category": category, "prompt": row["turns"][0] if "turns" in row else row["prompt"]})
    if not rows:
        raise ValueError(f"{path} holds no prompts")
    return rows


class _ForwardTimer:
    """Counts a model's forwards and the seconds spent in them. On a CUDA device a forward is timed with CUDA events
    recorded in its stream (a host clock would time the queueing of its kernels), read once the run is done: timing
    adds no synchronisation to the loop it measures."""

    def __init__(self, model):
        self.count, self._seconds, self._start = 0, 0.0, 0.0
        self._events: list = []  # CUDA: (start, end) event pairs not yet read
        self.device = next(model.parameters()).device
        self.handles = [model.register_forward_pre_hook(self._before), model.register_forward_hook(self._after)]

    def _before(self, *_):
        self.count += 1
        if self.device.type == "cuda":
            self._events.append((torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)))
            self._events[-1][0].record()
        else:
            self._start = time.perf_counter()

    def _after(self, *_):
        if self.device.type == "cuda":
            self._events[-1][1].record()
        else:
            self._seconds += time.perf_counter() - self._start

    @property
    def seconds(self) -> float:
        """Seconds spent in the forwards since the last `reset` (on CUDA: waits for them to finish)."""
        if self._events:
            self._events[-1][1].synchronize()
            self._seconds += sum(start.elapsed_time(end) for start, end in self._events) / 1000
            self._events = []
        return self._seconds

    def reset(self):
        self.count, self._seconds, self._events = 0, 0.0, []

    def remove(self):
        for handle in self.handles:
            handle.remove()


def bench_methods(drafter=None, mdlm_drafter=None, ar_drafter=None, conditioned_drafter=None,
                  num_drafts: tuple[int, ...] = (1,), prompt_lookup_tokens: int = 10,
                  with_lookup: bool = False, dflash_drafter=None,
                  lookup_drafts: tuple[int, ...] = (DEFAULT_NUM_LOOKUP_DRAFTS,)) -> dict[str, dict]:
    """The methods `benchmark` runs with these drafters: name -> generation options, in run order."""
    methods = {"plain": dict(), PLAIN_AGAIN: dict()}
    methods["prompt lookup"] = dict(prompt_lookup_num_tokens=prompt_lookup_tokens)
    if ar_drafter is not None:
        methods["AR drafter"] = dict(assistant_model=ar_drafter)
    if mdlm_drafter is not None:
        kind = " conditioned" if mdlm_drafter.config.is_conditioned else ""
        for k in num_drafts:
            methods[f"SpecDiff{kind} (mdlm, K={k})"] = dict(specdiff=mdlm_drafter, num_drafts=k)
    if drafter is not None:
        methods["SpecDiff-2 drop-in"] = dict(assistant_model=drafter)
        methods["SpecDiff-2 drop-in, drafter only"] = dict(assistant_model=drafter, assistant_lookup_tokens=0)
        for k in num_drafts:
            methods[f"SpecDiff-2 (K={k})"] = dict(specdiff=drafter, num_drafts=k)
    for kind, conditioned in (("conditioned", conditioned_drafter), ("dflash", dflash_drafter)):
        if conditioned is None:
            continue
        methods[f"SpecDiff-2 {kind} drop-in"] = dict(assistant_model=conditioned, attach=True)
        methods[f"SpecDiff-2 {kind} drop-in, drafter only"] = dict(assistant_model=conditioned, attach=True,
                                                                   assistant_lookup_tokens=0)
        if kind == "dflash":  # transformers' own DFlash loop
            methods["SpecDiff-2 dflash, transformers' loop"] = dict(assistant_model=conditioned,
                                                                     speculation_type="dflash")
        for k in num_drafts:
            methods[f"SpecDiff-2 {kind} (K={k})"] = dict(specdiff=conditioned, num_drafts=k)
    if with_lookup:
        for name in [m for m in methods if m.startswith("SpecDiff") and "specdiff" in methods[m]]:
            for count in lookup_drafts:
                label = "" if count == DEFAULT_NUM_LOOKUP_DRAFTS else f" x{count}"
                methods[f"{name} + lookup{label}"] = dict(methods[name], lookup_tokens=prompt_lookup_tokens,
                                                          num_lookup_drafts=count)
    return methods


def benchmark(verifier, tokenizer, prompts: list[dict], drafter=None, mdlm_drafter=None, ar_drafter=None,
              conditioned_drafter=None, dflash_drafter=None, num_drafts: tuple[int, ...] = (1,),
              max_new_tokens: int = 256,
              prompt_lookup_tokens: int = 10, with_lookup: bool = False, only: list[str] | None = None,
              records_file=None, run_info: dict | None = None, progress: bool = True,
              threads: int | None = None, repeats: int = 1,
              lookup_drafts: tuple[int, ...] = (DEFAULT_NUM_LOOKUP_DRAFTS,), sampling: dict | None = None) -> dict:
    """Run every available method on every prompt (interleaved) and return per-category and overall results.

    `drafter` is the standalone (token-only) SpecDiff-2 drafter, `conditioned_drafter` one that reads the verifier's
    hidden states, `dflash_drafter` one of the dflash layout (also run through transformers' own DFlash loop);
    `by_kind` sorts drafters into these three. `mdlm_drafter` is an unaligned one of either kind (its label says
    which); any may be None. Each runs at every K in `num_drafts`. `with_lookup` adds, for every SpecDiff
    method, a "+ lookup" one whose tree also holds prompt-lookup drafts of `prompt_lookup_tokens` tokens, one
    method per count in `lookup_drafts` ("+ lookup x1" for one draft; no suffix for the default count). `only`
    keeps the named methods (plain always runs: it is the reference; so does `PLAIN_WITH_KERNELS` where it
    applies). `records_file` (JSON lines) receives each prompt's records when the prompt is done; if it exists,
    its finished prompts are kept and the run goes on from there, provided the methods, prompts and `run_info`
    (anything else a resumed run must share, such as the drafter paths) are the same. `threads` sets torch's thread
    count for the run; the caller's count is restored on return. `repeats` > 1 runs each prompt that many times through every method (the order reversed every other
    time) and keeps each method's fastest run: timing noise from other work on the machine only ever adds time.
    `sampling` (e.g. `{"temperature": 0.7, "top_p": 0.9}`) samples instead of greedy decoding, every method of a
    prompt from the same seed; sampled texts differ between methods, so no exact-match rate is reported."""
    methods = bench_methods(drafter, mdlm_drafter, ar_drafter, conditioned_drafter, num_drafts, prompt_lookup_tokens,
                            with_lookup, dflash_drafter, lookup_drafts)
    drafters = [m for m in (drafter, mdlm_drafter, ar_drafter, conditioned_drafter, dflash_drafter) if m is not None]
    with torch_threads(threads):  # this machine's cost profiles, measured once (cached), not in a timed call
        profiles = [model.cost_profile(verifier) for model in drafters if hasattr(model, "cost_profile")]
    kernels = next((p for p in profiles if p is not None and p.chooses_kernels), None)
    if kernels is not None:  # the SpecDiff loop's plain steps run faster than plain `generate`'s: show by how much
        methods = {"plain": methods.pop("plain"), PLAIN_WITH_KERNELS: dict(kernels=kernels), **methods}
    if only is not None:
        unknown = [m for m in only if m not in methods]
        if unknown:
            raise ValueError(f"unknown method(s) {unknown}; with the drafters given, the methods are {list(methods)}")
        methods = {m: o for m, o in methods.items() if m in ("plain", PLAIN_WITH_KERNELS) or m in only}
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    settings = {"methods": list(methods), "max_new_tokens": max_new_tokens, "num_prompts": len(prompts),
                **({"repeats": repeats} if repeats > 1 else {}), **({"sampling": sampling} if sampling else {}),
                "prompt_lookup_tokens": prompt_lookup_tokens, "prompts": _fingerprint(prompts), **(run_info or {})}
    records, done = _resume(records_file, settings)
    with torch_threads(threads):
        timers = {}
        for model in (verifier, *drafters):  # one timer per model, however many methods share it
            if id(model) not in timers:
                timers[id(model)] = _ForwardTimer(model)
        try:
            if verifier.device.type != "cpu" and done < len(prompts):  # untimed: kernels, allocator, first costs
                _run_prompt(verifier, tokenizer, prompts[done], methods, min(16, max_new_tokens), timers, 1,
                            sampling and dict(sampling, seed=0))
            for index, item in enumerate(tqdm(prompts[done:], desc="bench", initial=done, total=len(prompts),
                                              disable=not progress), start=done):
                mine = _run_prompt(verifier, tokenizer, item, methods, max_new_tokens, timers, repeats,
                                   sampling and dict(sampling, seed=index))
                records += mine
                if records_file is not None:
                    with open(records_file, "a") as f:
                        f.write(json.dumps({"prompt": index, "records": mine}) + "\n")
        finally:
            for timer in timers.values():
                timer.remove()
    return summarize(records, list(methods))


def by_kind(drafters: list) -> dict:
    """`benchmark`'s drafter arguments for SpecDiff drafters: {"drafter": standalone, "conditioned_drafter":
    conditioned, "dflash_drafter": dflash layout}, at most one of each."""
    kinds = {"drafter": [], "conditioned_drafter": [], "dflash_drafter": []}
    for d in drafters:
        kind = "dflash_drafter" if getattr(d.config, "layout", None) == "dflash" else \
            "conditioned_drafter" if d.config.is_conditioned else "drafter"
        kinds[kind].append(d)
    if any(len(found) > 1 for found in kinds.values()):
        raise ValueError("the drafters are the same kind: pass at most one standalone, one conditioned and one of "
                         "the dflash layout")
    return {name: (found or [None])[0] for name, found in kinds.items()}


def _run_prompt(verifier, tokenizer, item: dict, methods: dict, max_new_tokens: int, timers: dict,
                repeats: int = 1, sampling: dict | None = None) -> list[dict]:
    """One prompt through every method in turn, `repeats` times (in reverse order every other time): a record each
    (tokens, seconds, forwards, acceptance, exactness against plain; None when sampling), from the method's fastest
    run."""
    inputs = tokenizer.apply_chat_template([{"role": "user", "content": item["prompt"]}],
                                           add_generation_prompt=True, return_tensors="pt", return_dict=True)
    inputs = {k: v.to(verifier.device) for k, v in inputs.items()}
    fastest = {}
    for repeat in range(repeats):
        for name in list(methods)[:: 1 if repeat % 2 == 0 else -1]:
            record = _run_method(verifier, inputs, dict(methods[name]), max_new_tokens, timers, sampling)
            if name not in fastest or record["seconds"] < fastest[name]["seconds"]:
                fastest[name] = record
    reference = fastest["plain"]["output"]
    return [{"category": item["category"], "method": name, **{k: v for k, v in fastest[name].items() if k != "output"},
             "exact": None if sampling else fastest[name]["output"] == reference} for name in methods]


def _run_method(verifier, inputs: dict, options: dict, max_new_tokens: int, timers: dict,
                sampling: dict | None = None) -> dict:
    """One generation: its output tokens, seconds, verifier and drafter forwards and the drafts' acceptance.
    `sampling`: sampling options and the `seed` to draw from; None: greedy."""
    stats = SpecDiffStats()
    sampling = dict(sampling or {})
    if sampling:
        torch.manual_seed(sampling.pop("seed"))
    options = dict(options, do_sample=bool(sampling), **sampling)
    verifier_timer = timers[id(verifier)]
    drafter_timer = timers.get(id(options.get("specdiff", options.get("assistant_model"))))
    for timer in (verifier_timer, drafter_timer):
        if timer is not None:
            timer.reset()
    kernels = options.pop("kernels", None)
    start = device_clock(verifier.device)
    if kernels is not None:
        with kernels.verifier_kernels(verifier):
            out = _assisted_generate(verifier, inputs, max_new_tokens, options)
    elif "specdiff" in options:
        out = generate(verifier, options.pop("specdiff"), **inputs, max_new_tokens=max_new_tokens, stats=stats,
                       **options)
    else:
        out = _assisted_generate(verifier, inputs, max_new_tokens, options)
    seconds = device_clock(verifier.device) - start
    tokens = out[0, inputs["input_ids"].shape[1]:].tolist()
    return {"tokens": len(tokens), "seconds": seconds, "forwards": verifier_timer.count,
            "verifier_seconds": verifier_timer.seconds, "drafter_forwards": drafter_timer.count if drafter_timer else 0,
            "drafter_seconds": drafter_timer.seconds if drafter_timer else 0.0, "drafted": stats.drafted,
            "accepted": stats.accepted, "output": tokens}


def _assisted_generate(verifier, inputs, max_new_tokens, options):
    """transformers' own generate (plain, prompt lookup, or an `assistant_model`; `attach` hooks a conditioned
    drafter onto the verifier for the call; `assistant_lookup_tokens` sets the drafter's for the call)."""
    attach = options.pop("attach", False)
    drafter = options.get("assistant_model")
    lookup_tokens = options.pop("assistant_lookup_tokens", None)
    saved = getattr(drafter, "assistant_lookup_tokens", None)
    if lookup_tokens is not None:
        drafter.assistant_lookup_tokens = lookup_tokens
    if attach:
        drafter.attach(verifier)
    try:
        return verifier.generate(**inputs, max_new_tokens=max_new_tokens, **options)
    finally:
        if attach:
            drafter.detach()
        if lookup_tokens is not None:
            drafter.assistant_lookup_tokens = saved


def _fingerprint(prompts: list[dict]) -> str:
    return hashlib.sha256(json.dumps(prompts, sort_keys=True).encode()).hexdigest()[:16]


def _resume(records_file, settings: dict) -> tuple[list[dict], int]:
    """The records already in `records_file` and how many prompts they cover; starts the file if it is new."""
    if records_file is None:
        return [], 0
    path = Path(records_file)
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    if not lines:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"settings": settings}) + "\n")
        return [], 0
    old = lines[0].get("settings") or {}
    if old != settings:
        differ = {k: (old.get(k), settings.get(k)) for k in {*old, *settings} if old.get(k) != settings.get(k)}
        raise ValueError(f"{path} holds records of a run with other settings (then, now: {differ}); delete it or "
                         "write to another folder")
    records = [r for line in lines[1:] for r in line["records"]]
    return records, len(lines) - 1


def summarize(records: list[dict], methods: list[str]) -> dict:
    """Aggregate per (category, method) and overall; speed-ups are ratios of summed tokens over summed time."""
    categories = sorted({r["category"] for r in records}) + ["overall"]
    table = {}
    for category in categories:
        rows = [r for r in records if category == "overall" or r["category"] == category]
        plain_rate = _rate([r for r in rows if r["method"] == "plain"])
        table[category] = {}
        for method in methods:
            mine = [r for r in rows if r["method"] == method]
            drafted, accepted = _sum_lists([r["drafted"] for r in mine]), _sum_lists([r["accepted"] for r in mine])
            verifier_ms = 1000 * sum(r["verifier_seconds"] for r in mine) / max(sum(r["forwards"] for r in mine), 1)
            drafter_forwards = sum(r["drafter_forwards"] for r in mine)
            drafter_ms = 1000 * sum(r["drafter_seconds"] for r in mine) / drafter_forwards if drafter_forwards else None
            table[category][method] = {
                "tok_s": _rate(mine), "speedup": _rate(mine) / plain_rate if plain_rate else None,
                "tau": sum(r["tokens"] for r in mine) / max(sum(r["forwards"] for r in mine), 1),
                "exact_match": None if any(r["exact"] is None for r in mine) else
                sum(r["exact"] for r in mine) / len(mine), "prompts": len(mine),
                "acceptance_by_position": [a / d for a, d in zip(accepted, drafted) if d],
                "verifier_ms_per_forward": verifier_ms, "drafter_ms_per_forward": drafter_ms,
                "drafter_cost": drafter_ms / verifier_ms if drafter_ms is not None and verifier_ms else None,
            }
    return {"methods": methods, "results": table, "records": records,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def _rate(rows):
    seconds = sum(r["seconds"] for r in rows)
    return sum(r["tokens"] for r in rows) / seconds if seconds else 0.0


def _sum_lists(lists):
    out = []
    for values in lists:
        out += [0] * (len(values) - len(out))
        for i, v in enumerate(values):
            out[i] += v
    return out


def markdown_table(summary: dict) -> str:
    """Speed-up (tau, exact-match rate when greedy) per method and category."""
    methods, results = summary["methods"], summary["results"]
    lines = ["| category | " + " | ".join(methods) + " |", "|---" * (len(methods) + 1) + "|"]
    for category, row in results.items():
        cells = [f"{row[m]['speedup']:.2f}x (tau {row[m]['tau']:.2f}"
                 + (f", exact {row[m]['exact_match']:.0%})" if row[m]["exact_match"] is not None else ")")
                 for m in methods]
        lines.append(f"| {category} | " + " | ".join(cells) + " |")
    overall = results["overall"]
    lines.append("")
    lines.append("plain: " + f"{overall['plain']['tok_s']:.1f} tok/s overall; peak RSS {summary['peak_rss_mb']:.0f} MB")
    if PLAIN_AGAIN in methods:
        again = [row[PLAIN_AGAIN]["speedup"] for category, row in results.items() if category != "overall"]
        lines.append(f"noise floor: plain again ran {min(again):.2f}x-{max(again):.2f}x plain by category "
                     f"({overall[PLAIN_AGAIN]['speedup']:.2f}x overall); speed-ups within that are noise")
    costs = [f"{m} {overall[m]['drafter_ms_per_forward']:.1f} ms ({overall[m]['drafter_cost']:.0%} of a verifier "
             f"forward of {overall[m]['verifier_ms_per_forward']:.1f} ms)" for m in methods
             if overall[m].get("drafter_cost") is not None]
    if costs:
        lines.append("drafter forward: " + "; ".join(costs))
    return "\n".join(lines)


def save(summary: dict, out) -> Path:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(summary, indent=2))
    (out / "results.md").write_text(markdown_table(summary) + "\n")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return out
    results, methods = summary["results"], [m for m in summary["methods"] if m != "plain"]
    categories = list(results)
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(categories)), 3.5))
    width = 0.8 / max(len(methods), 1)
    for i, method in enumerate(methods):
        ax.bar([c + i * width for c in range(len(categories))], [results[c][method]["speedup"] for c in categories],
               width, label=method)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks([c + width * (len(methods) - 1) / 2 for c in range(len(categories))], categories, rotation=20)
    ax.set_ylabel("speed-up over plain")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "speedup_by_category.png", dpi=120)
    plt.close(fig)
    plot_acceptance({m: results["overall"][m] for m in methods if results["overall"][m]["acceptance_by_position"]},
                    out / "acceptance_by_position.png")
    return out
