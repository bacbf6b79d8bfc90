"""What a round costs on this machine: a `CostProfile` of the verifier's forward over n new tokens and the drafter's
call, measured once per machine and models and kept on disk (`cost_profile`), and `RoundCosts`, which adds to it what
a generation's loop measurably spends around those forwards. The policies (`policies_specdiff.py`) weigh expected
tokens against these costs.

This file ships to the Hub as remote code: it imports only torch and transformers.
"""

import copy
import functools
import hashlib
import json
import logging
import os
import platform
import time
import weakref
from dataclasses import dataclass, field

import torch

from transformers import DynamicCache
from transformers.generation.utils import GenerateDecoderOnlyOutput

logger = logging.getLogger(__name__)

# the name models take their cache under: `cache` from transformers 5.24 on (the old name is still taken, with a warning)
CACHE_KWARG = "cache" if "cache" in GenerateDecoderOnlyOutput.__dataclass_fields__ else "past_key_values"


def device_clock(device: torch.device | str) -> float:
    """`time.perf_counter()` once the work queued on `device` has run: on an asynchronous device (CUDA, XPU, MPS) a
    host clock alone would time the queueing of a round, not the round. Called where a policy times rounds, at
    points where the loop has waited for the device anyway (its acceptance decision), so it adds no stall there."""
    device = torch.device(device)
    backend = getattr(torch, device.type, None) if device.type != "cpu" else None
    if backend is not None and hasattr(backend, "synchronize"):
        backend.synchronize() if device.type == "mps" else backend.synchronize(device)
    return time.perf_counter()


@dataclass
class CostProfile:
    """What rounds cost on this machine for one verifier and drafter, in the dtypes and thread count they run with:
    `verifier[n]`, the seconds of a verifier forward over n new tokens after a cached context (n = 1 is a plain
    decoding step), and `drafter[g]`, the seconds of a drafter call that drafts g tokens. Measured once
    (`measure_costs`) and cached per machine and models (`cost_profile`); every draft-length and tree-size policy
    starts from it, so the first round already knows what a verified token costs here.

    Where a CPU verifier's forwards over few tokens run faster without oneDNN (bf16 on a CPU with AVX512-BF16 and no
    AMX: a plain step 23 ms against 40 ms), `onednn_from` is the fewest new tokens a forward runs with it (fewer run
    without it, `verifier_kernels`), `verifier` holds those chosen forwards' seconds and `torch_kernels` the seconds as
    torch runs them by default; elsewhere `onednn_from` is None and `torch_kernels` empty. Where forwards run faster
    with the verifier's linear weights laid out once for oneDNN (`PackedLinears`; fp32 on an AVX2-only EPYC: a forward
    over 2 new tokens 1.1 plain steps against 1.7), `packed_from` is the fewest new tokens a forward runs with them,
    and `torch_kernels` holds torch's own seconds too."""

    verifier: dict[int, float]
    drafter: dict[int, float] = field(default_factory=dict)
    machine: dict = field(default_factory=dict)
    onednn_from: int | None = None
    torch_kernels: dict[int, float] = field(default_factory=dict)
    packed_from: int | None = None

    def verifier_seconds(self, num_tokens: torch.Tensor) -> torch.Tensor:
        """Seconds of verifier forwards over `num_tokens` new tokens (piecewise linear between measured counts, the
        last segment's slope beyond them)."""
        return _interpolate(self.verifier, num_tokens)

    def drafter_seconds(self, num_tokens: torch.Tensor) -> torch.Tensor:
        """Seconds of drafter calls drafting `num_tokens` tokens (0 where `num_tokens` is 0: no call)."""
        num_tokens = torch.as_tensor(num_tokens, dtype=torch.float64)
        if not self.drafter:
            return torch.zeros_like(num_tokens)
        return torch.where(num_tokens > 0, _interpolate(self.drafter, num_tokens.clamp_min(1)), 0.0)

    def round_seconds(self, lengths: torch.Tensor, drafted: bool = True) -> torch.Tensor:
        """Seconds of rounds that verify `lengths` drafted tokens (and the last committed one), with the drafter's
        call where `drafted` and a length is > 0. Length 0 is a plain step."""
        lengths = torch.as_tensor(lengths, dtype=torch.float64)
        seconds = self.verifier_seconds(lengths + 1)
        return seconds + self.drafter_seconds(lengths) if drafted else seconds

    @property
    def plain_step(self) -> float:
        """Seconds of a plain decoding step."""
        return float(self.verifier_seconds(torch.tensor([1.0]))[0])

    @property
    def torch_plain_step(self) -> float:
        """Seconds of a plain decoding step with torch's default kernels (plain `generate` as a user runs it)."""
        return float(_interpolate(self.torch_kernels, torch.tensor([1.0]))[0]) if self.torch_kernels else \
            self.plain_step

    def best_rate(self, acceptance: torch.Tensor, max_length: int, drafted: bool = True) -> tuple[int, float]:
        """The draft length (0: a plain step) with the most expected tokens per second if position i is accepted
        with probability `acceptance[i]` once the positions before it were, and that rate."""
        lengths = torch.arange(0, max_length + 1)
        expected = 1 + torch.cat([torch.zeros(1), acceptance[:max_length].double().cumprod(0)]).cumsum(0)
        rate = expected[:len(lengths)] / self.round_seconds(lengths[:len(expected)], drafted)
        return int(rate.argmax()), float(rate.max())

    @property
    def chooses_kernels(self) -> bool:
        """Whether some verifier forwards run with other kernels than torch's defaults (`verifier_kernels`)."""
        return self.onednn_from is not None or self.packed_from is not None

    def kernels_chosen(self) -> str:
        """What this profile runs differently from torch's defaults, in words ("" where nothing)."""
        chosen = []
        if self.packed_from is not None:
            chosen.append("verifier forwards" + (f" over {self.packed_from} or more new tokens" if self.packed_from > 1
                                                 else "") + " run faster with their linear weights packed for oneDNN")
        if self.onednn_from is not None:
            chosen.append(f"verifier forwards over fewer than {self.onednn_from} new tokens run faster without oneDNN")
        return "; ".join(chosen)

    def verifier_kernels(self, verifier) -> "VerifierKernels":
        """A context in which `verifier`'s forwards run with the kernels this profile chose (`onednn_from`,
        `packed_from`)."""
        return VerifierKernels(verifier, self.onednn_from, self.packed_from)

    def to_dict(self) -> dict:
        return {"verifier": self.verifier, "drafter": self.drafter, "machine": self.machine,
                "onednn_from": self.onednn_from, "torch_kernels": self.torch_kernels, "packed_from": self.packed_from}

    @classmethod
    def from_dict(cls, data: dict) -> "CostProfile":
        return cls({int(k): float(v) for k, v in data["verifier"].items()},
                   {int(k): float(v) for k, v in data.get("drafter", {}).items()}, data.get("machine", {}),
                   data.get("onednn_from"), {int(k): float(v) for k, v in data.get("torch_kernels", {}).items()},
                   data.get("packed_from"))


def _interpolate(points: dict[int, float], x: torch.Tensor) -> torch.Tensor:
    keys = sorted(points)
    xs = torch.tensor(keys, dtype=torch.float64)
    ys = torch.tensor([points[k] for k in keys], dtype=torch.float64)
    x = torch.as_tensor(x, dtype=torch.float64)
    if len(keys) == 1:
        return torch.full_like(x, float(ys[0]))
    segment = (torch.searchsorted(xs, x.contiguous(), right=True) - 1).clamp(0, len(keys) - 2)
    slope = (ys[segment + 1] - ys[segment]) / (xs[segment + 1] - xs[segment])
    return (ys[segment] + slope * (x - xs[segment])).clamp_min(float(ys.min()) * 0.5)


# the verifier forwards a profile times (new tokens after the context), and the cached context they follow
PROFILE_LENGTHS = (1, 2, 3, 4, 6, 8, 12, 16, 20)
PROFILE_CONTEXT = 128
PROFILE_REPEATS = 5  # each timed this many times, the fastest kept (`measure_costs`)


def machine_description(device: torch.device) -> dict:
    """What a cost profile depends on besides the models: processor, SIMD level, torch, threads, accelerator."""
    description = {"torch": torch.__version__, "threads": torch.get_num_threads(), "device": device.type,
                   "cpu_capability": torch.backends.cpu.get_cpu_capability(), "processor": platform.processor()}
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as info:
            names = [line.split(":", 1)[1].strip() for line in info if line.startswith("model name")]
        description["processor"] = names[0] if names else description["processor"]
    if device.type == "cuda":
        description["accelerator"] = torch.cuda.get_device_name(device)
    return description


@torch.no_grad()
def measure_costs(verifier, drafter=None, repeats: int = PROFILE_REPEATS, lengths=PROFILE_LENGTHS,
                  context: int = PROFILE_CONTEXT) -> CostProfile:
    """Time the verifier's forward over each of `lengths` new tokens after `context` cached tokens, and the
    drafter's call drafting 1 and its most tokens: the fastest of `repeats`, interleaved, after one untimed pass.
    The fastest, not the median: other work on the machine only adds time, and a profile is kept once and for all.
    (Medians of 3 taken while another process ran put a plain fp32 step at 215 ms and an 8-token forward at 2.47
    plain steps, where this machine alone takes 72 ms and 1.31.) Rounds scale the profile by how much slower the
    machine runs while they do (`RoundCosts.slowdown`), but not its shape. Where oneDNN may be switched off
    (`onednn_is_optional`) and has kernels for the verifier's dtype here (`onednn_has_kernels`), each verifier forward
    is also timed without it, and the profile chooses between them (`CostProfile.onednn_from`); where oneDNN can lay
    out the verifier's linear weights (`PackedLinears.apply_to`), each is timed with them too (`packed_from`)."""
    device = verifier.device
    vocab = verifier.config.get_text_config().vocab_size
    ids = torch.randint(vocab, (1, context + max(lengths)), generator=torch.Generator().manual_seed(0)).to(device)
    context_cache = DynamicCache(config=verifier.config)
    verifier(input_ids=ids[:, :context], use_cache=True, **{CACHE_KWARG: context_cache})

    def verifier_forward(n, onednn=True, packed=None):
        cache = copy.deepcopy(context_cache)  # a fresh copy each time: every cache layer kind, every version
        initial, torch.backends.mkldnn.enabled = torch.backends.mkldnn.enabled, onednn
        if packed is not None:
            packed.use()
        try:
            start = device_clock(device)
            verifier(input_ids=ids[:, context:context + n], use_cache=True, logits_to_keep=n, **{CACHE_KWARG: cache})
            return device_clock(device) - start
        finally:
            torch.backends.mkldnn.enabled = initial
            if packed is not None:
                packed.restore()

    runs = {}
    if drafter is not None:
        drafter_cache, prompt = drafter.new_cache(), ids[:, :context].to(drafter.device)
        drafter.draft(prompt, drafter_cache, 1)  # encodes the prompt: later calls draft after a cached context

        def drafter_call(g):
            start = device_clock(drafter.device)
            drafter.draft(prompt, drafter_cache, g)
            return device_clock(drafter.device) - start

        runs.update({("drafter", g): functools.partial(drafter_call, g)
                     for g in sorted({1, drafter.config.max_draft_tokens})})
    runs.update({("verifier", n): functools.partial(verifier_forward, n) for n in lengths})
    if onednn_is_optional(verifier) and onednn_has_kernels(verifier.dtype):
        runs.update({("no oneDNN", n): functools.partial(verifier_forward, n, False) for n in lengths})
    packed_linears = PackedLinears(verifier) if PackedLinears.apply_to(verifier) else None
    if packed_linears is not None:
        runs.update({("packed", n): functools.partial(verifier_forward, n, packed=packed_linears) for n in lengths})
    seconds = {name: [] for name in runs}
    for repeat in range(repeats + 1):  # interleaved, so that a slow minute does not fall on one length
        for name, run in runs.items():
            elapsed = run()
            if repeat:
                seconds[name].append(elapsed)
    fastest = {name: min(times) for name, times in seconds.items()}
    verifier_seconds = {n: t for (kind, n), t in fastest.items() if kind == "verifier"}
    without = {n: t for (kind, n), t in fastest.items() if kind == "no oneDNN"}
    onednn_from = _onednn_from(verifier_seconds, without) if without else None
    chosen = {n: without[n] if onednn_from is not None and n < onednn_from else t for n, t in verifier_seconds.items()}
    packed = {n: t for (kind, n), t in fastest.items() if kind == "packed"}
    packed_from = _packed_from(chosen, packed) if packed else None
    chosen = {n: packed[n] if packed_from is not None and n >= packed_from else t for n, t in chosen.items()}
    if packed_linears is not None and packed_from is None:
        packed_linears.forget()  # not chosen: not kept in memory
    chose = onednn_from is not None or packed_from is not None
    return CostProfile(chosen, {g: t for (kind, g), t in fastest.items() if kind == "drafter"},
                       machine=machine_description(device), onednn_from=onednn_from,
                       torch_kernels=verifier_seconds if chose else {}, packed_from=packed_from)


def onednn_is_optional(verifier) -> bool:
    """Whether torch runs `verifier`'s matrix products with oneDNN and could run them without: a bf16 or fp16 model
    on a CPU where oneDNN is on (the only case where torch picks it for them; fp32 products never use it)."""
    return verifier.device.type == "cpu" and verifier.dtype in (torch.bfloat16, torch.float16) and \
        torch.backends.mkldnn.is_available() and bool(torch.backends.mkldnn.enabled)


def onednn_has_kernels(dtype: torch.dtype) -> bool:
    """Whether oneDNN has `dtype` matrix products for this CPU, as torch asks before it hands them over (bf16: AVX512
    or AVX-NE-CONVERT). Not on an AVX2-only CPU, where torch runs its own kernels with oneDNN on or off, and timing
    both compares one kernel with itself. True where torch cannot say: the timings decide."""
    check = getattr(torch.ops.mkldnn, "_is_mkldnn_fp16_supported" if dtype == torch.float16 else
                    "_is_mkldnn_bf16_supported", None)
    try:
        return check is None or bool(check())
    except RuntimeError:
        return True


def _onednn_from(with_onednn: dict[int, float], without: dict[int, float], margin: float = 0.05) -> int | None:
    """The fewest new tokens from which no measured forward is more than `margin` slower with oneDNN than without;
    None where a plain step (the fewest tokens measured) is not: the default kernels do as well where it matters
    most, as where torch does not use oneDNN for them and the two timings differ by noise alone. (On an AVX2-only
    EPYC a 20-token forward once timed 5.2% slower with oneDNN by noise, every other length within 3% either way, and
    switching oneDNN off below 21 tokens would have been a choice made of noise.)"""
    lengths = sorted(with_onednn)
    slower = [n for n in lengths if with_onednn[n] > (1 + margin) * without[n]]
    if lengths[0] not in slower:
        return None
    later = [n for n in lengths if n > max(slower)]
    return later[0] if later else max(slower) + 1


def _packed_from(unpacked: dict[int, float], packed: dict[int, float], margin: float = 0.05) -> int | None:
    """The fewest new tokens from which every measured forward runs more than `margin` faster with packed weights
    than without; None where the longest does not (a choice made of noise is no choice)."""
    start = None
    for n in sorted(unpacked, reverse=True):
        if packed[n] >= (1 - margin) * unpacked[n]:
            break
        start = n
    return start


def packing_allowed() -> bool:
    """False where the user set HF_SPECDIFF_PACKED_WEIGHTS=0: torch's own kernels, and no packed copies in memory."""
    return os.environ.get("HF_SPECDIFF_PACKED_WEIGHTS", "1") != "0"


# the batch a packed weight is laid out for: the forwards drafting makes cheaper verify 2-16 tokens (an fp32
# SmolLM2-135M on an AVX2-only EPYC ran forwards over 2-4 tokens in 1.05-1.25 plain steps with 2 or 4, 1.5 with 1)
PACKING_BATCH = 4


class PackedLinears:
    """A verifier's `nn.Linear` layers with their weights laid out once for oneDNN's products, as torch's compiler
    does for a frozen CPU model: torch's own products lay out a weight again at every call of a forward over a few
    tokens, which on an AVX2-only EPYC made an fp32 forward over 2 new tokens cost 1.7 plain steps (packed: 1.1,
    logits within 1e-4). `use()` routes the layers through them until `restore()`. The packed copies are kept per
    layer (as much memory again as the layers' weights), made at first use and again when a weight changes."""

    _kept: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # nn.Linear -> (its weight's identity, packed)

    def __init__(self, verifier):
        self.linears = [m for m in verifier.modules() if isinstance(m, torch.nn.Linear)]
        self.forwards = [self._packed_forward(linear) for linear in self.linears]

    @staticmethod
    def apply_to(verifier) -> bool:
        """Whether oneDNN can lay out `verifier`'s linear weights here: a CPU model whose layers are plain `nn.Linear`
        weights in a dtype oneDNN has products for on this CPU (fp32; bf16 needs AVX512 or AVX-NE-CONVERT), none of
        them wrapped by another library's forward (offloading, adapters), unless `packing_allowed()` says no."""
        linears = [m for m in verifier.modules() if isinstance(m, torch.nn.Linear)]
        ops = torch.ops.mkldnn
        if not packing_allowed() or verifier.device.type != "cpu" or not linears or \
                not torch.backends.mkldnn.is_available() or \
                not (hasattr(ops, "_reorder_linear_weight") and hasattr(ops, "_linear_pointwise")):
            return False
        if any("forward" in m.__dict__ or type(m).forward is not torch.nn.Linear.forward
               or m.weight.device.type != "cpu" or m.weight.dtype != verifier.dtype for m in linears):
            return False
        try:
            ops._reorder_linear_weight(torch.zeros(8, 8, dtype=verifier.dtype), PACKING_BATCH)
        except RuntimeError:  # "bf16 path needs the cpu support avx_ne_convert or avx512bw, avx512vl and avx512dq"
            return False
        return True

    @classmethod
    def _packed_forward(cls, linear):
        weight = linear.weight
        identity = (weight.data_ptr(), weight._version, weight.dtype, tuple(weight.shape))
        kept = cls._kept.get(linear)
        if kept is None or kept[0] != identity:
            kept = cls._kept[linear] = (identity, torch.ops.mkldnn._reorder_linear_weight(weight.detach(),
                                                                                         PACKING_BATCH))
        packed, bias = kept[1], None if linear.bias is None else linear.bias.detach()

        def forward(x):
            if x.dtype != packed.dtype:  # under autocast, say: as torch runs it
                return torch.nn.Linear.forward(linear, x)
            out = torch.ops.mkldnn._linear_pointwise(x.reshape(-1, x.shape[-1]), packed, bias, "none", [], "")
            return out.view(*x.shape[:-1], out.shape[-1])

        return forward

    def use(self):
        for linear, forward in zip(self.linears, self.forwards):
            linear.forward = forward

    def restore(self):
        for linear in self.linears:
            linear.__dict__.pop("forward", None)

    def forget(self):
        """Drop the packed copies (a later `PackedLinears` of these layers packs them again)."""
        for linear in self.linears:
            self._kept.pop(linear, None)


class VerifierKernels:
    """While active, each forward of `verifier` over at least `packed_from` new tokens runs with its linear weights
    packed (`PackedLinears`), each other one over fewer than `onednn_from` without oneDNN (faster there,
    `CostProfile`), and every other forward as torch runs it; nothing changes where both are None. Forward hooks on
    the verifier, taken off on exit, with oneDNN's setting and the layers as they were (oneDNN's is a process-wide
    setting: other threads' products during such a forward run without oneDNN too)."""

    def __init__(self, verifier, onednn_from: int | None, packed_from: int | None = None):
        self.verifier = verifier
        self.onednn_from = onednn_from if onednn_from is not None and onednn_is_optional(verifier) else None
        self.packed_from = packed_from if packed_from is not None and PackedLinears.apply_to(verifier) else None
        self.packed = None
        self.handles, self.saved = [], []

    def __enter__(self):
        if self.onednn_from is not None or self.packed_from is not None:
            self.initial = torch.backends.mkldnn.enabled
            if self.packed_from is not None and self.packed is None:
                self.packed = PackedLinears(self.verifier)  # packed at the first use, then kept per layer
            self.handles = [self.verifier.register_forward_pre_hook(self._before, with_kwargs=True),
                            self.verifier.register_forward_hook(self._after)]
        return self

    def _before(self, module, args, kwargs):
        tokens = kwargs.get("input_ids", args[0] if args else None)
        tokens = kwargs.get("inputs_embeds") if tokens is None else tokens
        num_tokens = None if tokens is None else tokens.shape[1]
        packed = self.packed_from is not None and num_tokens is not None and num_tokens >= self.packed_from
        self.saved.append((torch.backends.mkldnn.enabled, packed))
        if packed:
            self.packed.use()
        elif self.onednn_from is not None:
            torch.backends.mkldnn.enabled = num_tokens is None or num_tokens >= self.onednn_from

    def _after(self, module, args, output):
        torch.backends.mkldnn.enabled, packed = self.saved.pop()
        if packed:
            self.packed.restore()

    def __exit__(self, *exc):
        for handle in self.handles:
            handle.remove()
        if self.handles:
            torch.backends.mkldnn.enabled = self.initial
            if self.packed is not None:
                self.packed.restore()
        self.handles, self.saved = [], []

    def next_forward(self):
        """Active for the verifier's next forward only (transformers' assisted loop runs its verification forward
        right after each drafter call, and nothing of it can be wrapped): hooks that take themselves off after it.
        A no-op while armed, or where nothing changes."""
        if self.handles:
            return
        self.__enter__()
        if self.handles:
            self.handles.append(self.verifier.register_forward_hook(lambda *_: self.__exit__()))


class CpuContention:
    """How many cores other processes kept busy from its creation to `other_cores()`, against what the measurement
    left free (`contended`): a profile timed while they took cores from it prices every later run wrong (beside two
    busy processes on 2 cores a plain bf16 step timed 81 ms, alone 39 ms). Read from Linux's /proc/stat; elsewhere
    it knows nothing and says uncontended."""

    margin = 0.25  # cores other processes may take beyond the free ones (daemons, this process's own stragglers)

    def __init__(self, threads: int):
        self.threads = threads
        self.start = self._read()

    @staticmethod
    def _read() -> tuple[float, float, float, int] | None:
        """(busy CPU seconds of the whole machine, this process's CPU seconds, wall seconds, CPUs), or None."""
        try:
            with open("/proc/stat") as stat:
                lines = stat.read().splitlines()
        except OSError:
            return None
        ticks = [int(t) for t in lines[0].split()[1:9]]  # user nice system idle iowait irq softirq steal
        busy = (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")
        cpus = sum(1 for line in lines if line.startswith("cpu") and line[3:4].isdigit())
        return busy, time.process_time(), time.perf_counter(), cpus

    def other_cores(self) -> float | None:
        """Cores other processes kept busy on average since creation (None where unknown)."""
        end = self._read()
        if self.start is None or end is None or end[2] <= self.start[2]:
            return None
        others = (end[0] - self.start[0]) - (end[1] - self.start[1])
        return max(others, 0.0) / (end[2] - self.start[2])

    def contended(self, other_cores: float | None) -> bool:
        """Whether `other_cores` (read from `other_cores()`) is more than the measurement's threads left free."""
        return other_cores is not None and other_cores > max(self.start[3] - self.threads, 0) + self.margin


_KEYS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # verifier -> {what its key depends on: key}


def _cost_key(verifier, drafter) -> str:
    """The profile's name: a hash of the machine (oneDNN's switch included), both models' configs, dtypes and devices.
    Rounds ask for it at every generation and hashing the configs takes tens of ms, so it is kept per verifier for
    what can change in place."""
    state = (None if drafter is None else weakref.ref(drafter), verifier.dtype, verifier.device, torch.get_num_threads(),
             None if drafter is None else (drafter.dtype, drafter.device), bool(torch.backends.mkldnn.enabled),
             packing_allowed())
    keys = _KEYS.setdefault(verifier, {})
    if state not in keys:
        keys[state] = _hashed_cost_key(verifier, drafter)
    return keys[state]


def _hashed_cost_key(verifier, drafter) -> str:
    parts = [machine_description(verifier.device), verifier.config.to_json_string(use_diff=False), str(verifier.dtype),
             f"oneDNN {'on' if torch.backends.mkldnn.enabled else 'off'}",
             getattr(verifier.config, "_attn_implementation", None), PROFILE_LENGTHS, PROFILE_CONTEXT,
             f"fastest of {PROFILE_REPEATS}", "oneDNN chosen where it has kernels",
             "packed linears" if packing_allowed() else "no packed linears"]
    # older profiles (medians of 3, no kernel choice, a choice made of noise, no packed weights) are measured again
    if drafter is not None:
        parts += [drafter.config.to_json_string(use_diff=False), str(drafter.dtype), str(drafter.device)]
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def cost_profile_dir() -> str:
    """Where cost profiles are kept: $HF_SPECDIFF_COSTS, else `costs` in $HF_SPECDIFF_CACHE (~/.cache/hf_specdiff)."""
    root = os.environ.get("HF_SPECDIFF_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "hf_specdiff"))
    return os.environ.get("HF_SPECDIFF_COSTS", os.path.join(root, "costs"))


_PROFILES: dict[str, CostProfile] = {}


def cost_profile(verifier, drafter=None, measure: bool = True, fresh: bool = False) -> CostProfile | None:
    """This machine's `CostProfile` for `verifier` and `drafter` as they are now (dtypes, device, threads): from
    memory, else from `cost_profile_dir()`, else measured (a few seconds, once) and saved there, unless other
    processes took cores while it was timed (`CpuContention`). With `measure=False`, None where none was kept; with
    `fresh`, measured again in place of the one kept (`hf-specdiff doctor --measure`)."""
    key = _cost_key(verifier, drafter)
    if key in _PROFILES and not fresh:
        return _PROFILES[key]
    path = os.path.join(cost_profile_dir(), f"{key}.json")
    if os.path.isfile(path) and not fresh:
        try:
            with open(path) as file:
                _PROFILES[key] = CostProfile.from_dict(json.load(file))
            return _PROFILES[key]
        except (ValueError, KeyError) as error:
            logger.warning(f"ignoring the unreadable cost profile {path} ({error}); measuring again")
    if not measure:
        return None
    logger.warning("hf_specdiff: measuring what a verifier forward and a draft cost on this machine (once; kept in "
                   f"{path})")
    contention = CpuContention(torch.get_num_threads())
    profile = _PROFILES[key] = measure_costs(verifier, drafter)
    other_cores = contention.other_cores()
    if contention.contended(other_cores):
        logger.warning(f"hf_specdiff: other processes kept {other_cores:.1f} cores busy while the costs "
                       "were timed, which makes them wrong: used in this process, not kept (measured again next time)")
        return profile
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path + ".tmp", "w") as file:
            json.dump(profile.to_dict(), file, indent=1)
        os.replace(path + ".tmp", path)
    except OSError as error:
        logger.warning(f"could not keep the cost profile in {path} ({error}): it will be measured again next time")
    return profile


def set_cost_profile(verifier, drafter, profile: CostProfile):
    """Use `profile` for this pair from now on in this process (for example one measured on a quieter machine)."""
    _PROFILES[_cost_key(verifier, drafter)] = profile


class RoundCosts:
    """Measured seconds of a verification round against its draft length g: a line c0 + c1 * g fitted to the
    per-length means of the rounds that drafted (least squares, weighted by the rounds measured), and the measured
    mean for g = 0, a round that drafts nothing (a plain step: no drafter forward, which a round of any g > 0 pays
    once, whatever g). Until two draft lengths are measured, the slope is `prior_slope` times the intercept: it
    assumes extra verified tokens are cheap, and lets the policy try longer drafts until measurements say otherwise.

    With a `prior` (seconds of rounds by length, from this machine's `CostProfile`), a round costs the prior times
    how much slower the machine runs now than when the profile was measured (`slowdown`), plus what the loop measurably
    adds beyond that: the policy knows from the first round what each length costs. The slowdown is one factor over
    every round measured: a shared or throttled machine slows every forward alike, so a long round slows more than a
    short one, and an amount added to every round alike priced long trees under their cost there (docs/benchmarks.md,
    "Round costs on a machine slower than its profile"). What the loop adds is kept apart for plain steps (g = 0) and
    for rounds that draft: a drafting round pays more than its forwards (the drafter's cache, the verifier's
    features, a longer cache to cut), and one mean for both made drafting look cheaper than it is where most rounds
    are plain steps."""

    min_slope = 0.005  # a verified token is never taken as free: noise must not make the longest draft look best
    prior_rounds = 4  # the weight of `prior` against measured rounds, in rounds

    def __init__(self, prior_slope: float = 0.02, prior=None):
        self.prior_slope = prior_slope
        self.prior = prior
        self.seconds: dict[int, float] = {}
        self.rounds: dict[int, int] = {}
        self._prior_seconds: dict[int, float] = {}  # the prior by length, read once (rounds ask every time)
        self._measured = [0.0, 0.0]  # seconds measured, summed over plain steps and drafting rounds
        self._expected = [0.0, 0.0]  # the prior's seconds of the same rounds

    def record(self, length: int, seconds: float):
        self.seconds[length] = self.seconds.get(length, 0.0) + seconds
        self.rounds[length] = self.rounds.get(length, 0) + 1
        if self.prior is not None:
            self._measured[length > 0] += seconds
            self._expected[length > 0] += float(self._prior_at(torch.tensor([length]))[0])

    def predict(self, lengths: torch.Tensor) -> torch.Tensor:
        """Relative cost of rounds of these lengths (any positive scale; seconds with a `prior`)."""
        if self.prior is not None:
            return self._from_prior(lengths)
        drafted = [g for g in self.rounds if g > 0]
        intercept, slope = self._line(drafted or list(self.rounds))
        cost = intercept + slope * lengths.double()
        if drafted and 0 in self.rounds:
            cost = torch.where(lengths == 0, self.seconds[0] / self.rounds[0], cost)
        return cost.float()

    def _from_prior(self, lengths: torch.Tensor) -> torch.Tensor:
        """The prior's seconds times `slowdown`, plus what each kind of round (plain steps, drafting rounds) measurably
        adds beyond that, averaged over the rounds of that kind measured and `prior_rounds` rounds that add nothing."""
        slowdown = self.slowdown
        added = [(measured - slowdown * expected) / (count + self.prior_rounds)
                 for measured, expected, count in zip(self._measured, self._expected, self.rounds_by_kind)]
        prior = self._prior_at(lengths)
        added = torch.where(torch.as_tensor(lengths) > 0, added[1], added[0])
        return (slowdown * prior + added).clamp_min(0.1 * prior).float()

    @property
    def rounds_by_kind(self) -> list[int]:
        """Rounds measured: plain steps, drafting rounds."""
        plain = self.rounds.get(0, 0)
        return [plain, sum(self.rounds.values()) - plain]

    @property
    def slowdown(self) -> float:
        """Measured seconds over the prior's, over every round measured, averaged with `prior_rounds` rounds at 1:
        above 1 where the machine runs slower now than when its profile was measured."""
        rounds = sum(self.rounds.values()) if self.prior is not None else 0
        if not rounds:
            return 1.0
        return (rounds * sum(self._measured) / sum(self._expected) + self.prior_rounds) / (rounds + self.prior_rounds)

    def _prior_at(self, lengths: torch.Tensor) -> torch.Tensor:
        keys = [int(g) for g in torch.as_tensor(lengths).tolist()]
        missing = sorted(set(keys) - set(self._prior_seconds))
        if missing:
            self._prior_seconds.update(zip(missing, self.prior(torch.tensor(missing)).double().tolist()))
        return torch.tensor([self._prior_seconds[g] for g in keys], dtype=torch.float64)

    def _line(self, lengths: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """(c0, c1) of the line through the mean seconds at `lengths`."""
        if not lengths:
            return torch.tensor(1.0, dtype=torch.float64), torch.tensor(self.prior_slope, dtype=torch.float64)
        g = torch.tensor(lengths, dtype=torch.float64)
        n = torch.tensor([self.rounds[k] for k in lengths], dtype=torch.float64)
        mean = torch.tensor([self.seconds[k] / self.rounds[k] for k in lengths], dtype=torch.float64)
        if len(g) == 1:
            c0 = mean[0] / (1 + self.prior_slope * g[0])
            return c0, self.prior_slope * c0
        g_bar, m_bar = (n * g).sum() / n.sum(), (n * mean).sum() / n.sum()
        slope = (n * (g - g_bar) * (mean - m_bar)).sum() / (n * (g - g_bar) ** 2).sum()
        intercept = (m_bar - slope.clamp_min(0) * g_bar).clamp_min(0.1 * m_bar)
        return intercept, slope.clamp_min(self.min_slope * intercept)
