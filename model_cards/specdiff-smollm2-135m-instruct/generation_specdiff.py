"""Drafting with a SpecDiff drafter: the prefix cache, the unmasking schedule and the denoising sampler.

One drafting round encodes the tokens the verifier committed since the last round (causal attention, their
keys and values appended to the cache) together with a block of mask tokens (bidirectional attention inside
the block), then fills the block in T denoising steps. Step 1 is one forward over the new tokens plus the
block; steps 2..T are one forward over the block alone. Nothing is recomputed over the cached prefix.

A conditioned drafter (`config.verifier_layer_ids`) encodes no prefix tokens: its cache holds keys and values of
the verifier's hidden states at the committed tokens (`VerifierFeatures`, filled from the verifier's outputs or by
`VerifierHooks`), and its block is the last committed token (which the verifier has not read yet) plus the masks.

Lossless sampling rules. Speculative sampling accepts draft token i with probability min(1, p_i/q_i), which is
exact when token i was drawn from q_i and q_i depends only on the prefix and on draft tokens < i. So:
- `scores[i]` are the processed logits of the step at which token i was drawn, and token i was drawn from them;
- a step may only look at positions that are already unmasked (all < i under left-to-right chunks) and at mask
  tokens, which are constants;
- which positions a step unmasks must not depend on sampled values. Left-to-right chunks satisfy this;
  confidence-ordered unmasking does not, so it is used for greedy drafting only.

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

from transformers import DynamicCache, LogitsProcessorList, TopPLogitsWarper
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


class SpecDiffCache:
    """Keys and values of the drafter's committed prefix, with the cache interface transformers' assisted loop uses.

    `get_seq_length()` and `crop(-n)` are what `AssistedCandidateGenerator` calls between rounds. The cache also
    keeps the token ids it encoded, so a round re-encodes only from the first token that differs. When the
    context outgrows the drafter's window (`SpecDiffConfig.drafting_window`), the cache restarts from a recent
    window (`offset` is the absolute index of its first token).
    """

    def __init__(self):
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.token_ids: torch.Tensor | None = None  # [n] ids of the cached tokens
        self.offset = 0
        self.tokens_encoded = 0  # prefix tokens encoded over the cache's life: the drafting cost beyond the blocks
        self.verifier_features = VerifierFeatures()  # what a conditioned drafter reads (unused by a standalone one)
        self.assistant_rounds: AssistantRounds | None = None  # set when transformers' assisted loop calls the drafter

    @property
    def num_cached(self) -> int:
        return 0 if self.token_ids is None else self.token_ids.shape[0]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.offset + self.num_cached

    def crop(self, tokens_to_remove: int):
        """Remove `-tokens_to_remove` tokens from the end (transformers' convention: 0 is a no-op)."""
        if tokens_to_remove > 0:
            raise ValueError(f"crop takes a negative count of tokens to remove, got {tokens_to_remove}")
        self.truncate(self.get_seq_length() + tokens_to_remove)

    def truncate(self, length: int):
        """Keep the first `length` tokens (absolute positions)."""
        keep_cached = length - self.offset
        if keep_cached <= 0:
            self.reset()
        elif keep_cached < self.num_cached:
            self.token_ids = self.token_ids[:keep_cached]
            self.keys = [k[:, :, :keep_cached] for k in self.keys]
            self.values = [v[:, :, :keep_cached] for v in self.values]

    def reset(self, offset: int = 0):
        self.keys, self.values, self.token_ids, self.offset = [], [], None, offset

    def layer(self, idx: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        return (self.keys[idx], self.values[idx]) if idx < len(self.keys) else None

    def append(self, idx: int, key: torch.Tensor, value: torch.Tensor):
        if idx < len(self.keys):
            self.keys[idx] = torch.cat([self.keys[idx], key], dim=2)
            self.values[idx] = torch.cat([self.values[idx], value], dim=2)
        else:
            self.keys.append(key)
            self.values.append(value)

    def sync(self, input_ids: torch.Tensor, window: int, block_size: int) -> torch.Tensor:
        """Align the cache with `input_ids` ([seq]) and return the ids still to encode.

        Drops cached tokens that disagree with `input_ids`, and restarts from the last `window` tokens when the
        prefix plus a block would pass the position limit `window + block_size`.
        """
        length = input_ids.shape[0]
        if self.num_cached:
            cached = input_ids[self.offset : self.offset + self.num_cached]
            same = (cached == self.token_ids[: cached.shape[0]]).long().cumprod(0).sum().item()
            self.truncate(self.offset + same)
        if length - self.offset + block_size > window + block_size:
            self.reset(offset=max(0, length - window // 2))
        new_ids = input_ids[self.get_seq_length() :]
        self.token_ids = new_ids if self.token_ids is None else torch.cat([self.token_ids, new_ids])
        self.tokens_encoded += new_ids.shape[0]
        return new_ids


class VerifierFeatures:
    """The verifier's hidden states at the layers a conditioned drafter reads, one row per token it has read.

    `record(start, token_ids, features)` stores one verifier forward's inputs from absolute position `start`,
    dropping what was recorded from there on (rejected draft tokens, or another sequence). A verifier is causal, so
    the rows are valid for any sequence that starts with `token_ids`: `usable_length` is that common prefix.
    """

    def __init__(self):
        self._ids: torch.Tensor | None = None  # buffers that grow by doubling: a round writes only its new rows
        self._features: torch.Tensor | None = None
        self.length = 0

    @property
    def token_ids(self) -> torch.Tensor | None:
        """[n] the token ids the verifier read."""
        return None if self._ids is None else self._ids[: self.length]

    @property
    def features(self) -> torch.Tensor | None:
        """[n, num_layers * verifier_hidden_size] the verifier's features at those tokens."""
        return None if self._features is None else self._features[: self.length]

    def __len__(self) -> int:
        return self.length

    def reset(self):
        self._ids = self._features = None
        self.length = 0

    def record(self, start: int, token_ids: torch.Tensor, features: torch.Tensor):
        if start > self.length:  # positions before `start` are unknown: keep nothing
            self.reset()
            return
        end = start + token_ids.shape[0]
        if self._ids is None or end > self._ids.shape[0]:
            capacity = max(end, 2 * (0 if self._ids is None else self._ids.shape[0]))
            ids = token_ids.new_empty(capacity)
            rows = features.new_empty(capacity, features.shape[-1])
            if start:
                ids[:start], rows[:start] = self._ids[:start], self._features[:start]
            self._ids, self._features = ids, rows
        self._ids[start:end] = token_ids.to(self._ids.device)
        self._features[start:end] = features.detach().to(self._features)
        self.length = end

    def usable_length(self, input_ids: torch.Tensor) -> int:
        """How many leading tokens of `input_ids` ([seq]) have recorded features."""
        length = min(len(self), input_ids.shape[0])
        if not length:
            return 0
        same = self.token_ids[:length] == input_ids[:length].to(self.token_ids.device)
        return int(same.long().cumprod(0).sum())


def decoder_layers(model) -> torch.nn.ModuleList:
    """The verifier's decoder layers: its first module list with one entry per hidden layer."""
    num_layers = model.config.get_text_config().num_hidden_layers
    for module in model.modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) == num_layers:
            return module
    raise ValueError(f"cannot find the {num_layers} decoder layers of {type(model).__name__}")


class VerifierHooks:
    """Forward hooks that record, after each single-sequence verifier forward, the outputs of `layer_ids` into
    `features` (positions from the verifier cache's length before the call). They change no output; `remove()`
    takes them off. Batched or `inputs_embeds` forwards clear the store instead (a drafter drafts for one sequence).
    """

    def __init__(self, verifier, layer_ids: list[int], features: VerifierFeatures):
        self.features = features
        self.layer_ids = list(layer_ids)
        self._outputs: dict[int, torch.Tensor] = {}
        self._call: tuple[int, torch.Tensor | None] | None = None
        layers = decoder_layers(verifier)
        self.handles = [verifier.register_forward_pre_hook(self._before, with_kwargs=True),
                        verifier.register_forward_hook(self._after)]
        self.handles += [layers[i].register_forward_hook(self._capture(i)) for i in self.layer_ids]

    def _before(self, module, args, kwargs):
        input_ids = kwargs.get("input_ids", args[0] if args else None)
        cache = kwargs.get("cache", kwargs.get("past_key_values"))  # "cache" from transformers 5.24 on
        start = cache.get_seq_length() if cache is not None and hasattr(cache, "get_seq_length") else 0
        self._call = (start, input_ids)
        self._outputs.clear()

    def _capture(self, index: int):
        def hook(module, args, output):
            self._outputs[index] = (output[0] if isinstance(output, tuple) else output).detach()
        return hook

    def _after(self, module, args, output):
        start, input_ids = self._call or (0, None)
        if input_ids is None or input_ids.shape[0] != 1 or len(self._outputs) != len(self.layer_ids):
            self.features.reset()
        else:
            features = torch.cat([self._outputs[i][0] for i in self.layer_ids], dim=-1)
            self.features.record(start, input_ids[0], features)
        self._outputs.clear()
        self._call = None

    def remove(self):
        for handle in self.handles:
            handle.remove()
        self.handles = []


class AcceptanceRates:
    """Per draft position i, the rate a_i at which position i is accepted once every position before it was:
    (accepted_i + a_{i-1}) / (reached_i + 1), a_0 = `first_prior`. One pseudo-observation each: an untried first
    position counts as accepted half the time, a later position as doing as well as the one before it, so a position
    reached only a few times is not taken for one that is always accepted (which made long drafts look worth trying
    after every new prompt), and a first round does not verify a long draft nothing is known of (with a prior of 1,
    it verified 16 tokens, 6 plain steps' time where verified tokens are dear)."""

    def __init__(self, max_length: int, first_prior: float = 0.5):
        self.reached = torch.zeros(max_length)
        self.accepted = torch.zeros(max_length)
        self.first_prior = first_prior

    def rates(self) -> torch.Tensor:
        rate, prior = [], self.first_prior
        for accepted, reached in zip(self.accepted.tolist(), self.reached.tolist()):
            prior = (accepted + prior) / (reached + 1)
            rate.append(prior)
        return torch.tensor(rate)

    def update(self, num_drafted: int, num_accepted: int):
        reached = min(num_accepted + 1, num_drafted)
        self.reached[:reached] += 1
        self.accepted[:num_accepted] += 1



# ----------------------------------------------------------------------------------------------------------------
# What a round costs on this machine


@dataclass
class CostProfile:
    """What rounds cost on this machine for one verifier and drafter, in the dtypes and thread count they run with:
    `verifier[n]`, the seconds of a verifier forward over n new tokens after a cached context (n = 1 is a plain
    decoding step), and `drafter[g]`, the seconds of a drafter call that drafts g tokens. Measured once
    (`measure_costs`) and cached per machine and models (`cost_profile`); every draft-length and tree-size policy
    starts from it, so the first round already knows what a verified token costs here."""

    verifier: dict[int, float]
    drafter: dict[int, float] = field(default_factory=dict)
    machine: dict = field(default_factory=dict)

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

    def best_rate(self, acceptance: torch.Tensor, max_length: int, drafted: bool = True) -> tuple[int, float]:
        """The draft length (0: a plain step) with the most expected tokens per second if position i is accepted
        with probability `acceptance[i]` once the positions before it were, and that rate."""
        lengths = torch.arange(0, max_length + 1)
        expected = 1 + torch.cat([torch.zeros(1), acceptance[:max_length].double().cumprod(0)]).cumsum(0)
        rate = expected[:len(lengths)] / self.round_seconds(lengths[:len(expected)], drafted)
        return int(rate.argmax()), float(rate.max())

    def to_dict(self) -> dict:
        return {"verifier": self.verifier, "drafter": self.drafter, "machine": self.machine}

    @classmethod
    def from_dict(cls, data: dict) -> "CostProfile":
        return cls({int(k): float(v) for k, v in data["verifier"].items()},
                   {int(k): float(v) for k, v in data.get("drafter", {}).items()}, data.get("machine", {}))


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
def measure_costs(verifier, drafter=None, repeats: int = 3, lengths=PROFILE_LENGTHS,
                  context: int = PROFILE_CONTEXT) -> CostProfile:
    """Time the verifier's forward over each of `lengths` new tokens after `context` cached tokens, and the
    drafter's call drafting 1 and its most tokens (medians of `repeats`, interleaved, after one untimed pass)."""
    device = verifier.device
    vocab = verifier.config.get_text_config().vocab_size
    ids = torch.randint(vocab, (1, context + max(lengths)), generator=torch.Generator().manual_seed(0)).to(device)
    context_cache = DynamicCache(config=verifier.config)
    verifier(input_ids=ids[:, :context], use_cache=True, **{CACHE_KWARG: context_cache})

    def verifier_forward(n):
        cache = copy.deepcopy(context_cache)  # a fresh copy each time: every cache layer kind, every version
        start = device_clock(device)
        verifier(input_ids=ids[:, context:context + n], use_cache=True, logits_to_keep=n, **{CACHE_KWARG: cache})
        return device_clock(device) - start

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
    seconds = {name: [] for name in runs}
    for repeat in range(repeats + 1):  # interleaved, so that a slow minute does not fall on one length
        for name, run in runs.items():
            elapsed = run()
            if repeat:
                seconds[name].append(elapsed)
    median = {name: sorted(times)[len(times) // 2] for name, times in seconds.items()}
    return CostProfile({n: t for (kind, n), t in median.items() if kind == "verifier"},
                       {g: t for (kind, g), t in median.items() if kind == "drafter"},
                       machine=machine_description(device))


_KEYS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # verifier -> {what its key depends on: key}


def _cost_key(verifier, drafter) -> str:
    """The profile's name: a hash of the machine, both models' configs, dtypes and devices. Rounds ask for it at every
    generation and hashing the configs takes tens of ms, so it is kept per verifier for what can change in place."""
    state = (None if drafter is None else weakref.ref(drafter), verifier.dtype, verifier.device, torch.get_num_threads(),
             None if drafter is None else (drafter.dtype, drafter.device))
    keys = _KEYS.setdefault(verifier, {})
    if state not in keys:
        keys[state] = _hashed_cost_key(verifier, drafter)
    return keys[state]


def _hashed_cost_key(verifier, drafter) -> str:
    parts = [machine_description(verifier.device), verifier.config.to_json_string(use_diff=False), str(verifier.dtype),
             getattr(verifier.config, "_attn_implementation", None), PROFILE_LENGTHS, PROFILE_CONTEXT]
    if drafter is not None:
        parts += [drafter.config.to_json_string(use_diff=False), str(drafter.dtype), str(drafter.device)]
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def cost_profile_dir() -> str:
    """Where cost profiles are kept: $HF_SPECDIFF_COSTS, else `costs` in $HF_SPECDIFF_CACHE (~/.cache/hf_specdiff)."""
    root = os.environ.get("HF_SPECDIFF_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "hf_specdiff"))
    return os.environ.get("HF_SPECDIFF_COSTS", os.path.join(root, "costs"))


_PROFILES: dict[str, CostProfile] = {}


def cost_profile(verifier, drafter=None, measure: bool = True) -> CostProfile | None:
    """This machine's `CostProfile` for `verifier` and `drafter` as they are now (dtypes, device, threads): from
    memory, else from `cost_profile_dir()`, else measured (a few seconds, once) and saved there. With
    `measure=False`, None where none was kept."""
    key = _cost_key(verifier, drafter)
    if key in _PROFILES:
        return _PROFILES[key]
    path = os.path.join(cost_profile_dir(), f"{key}.json")
    if os.path.isfile(path):
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
    profile = _PROFILES[key] = measure_costs(verifier, drafter)
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

    With a `prior` (seconds of rounds by length, from this machine's `CostProfile`), a round costs the prior plus
    what the loop measurably adds to it: the policy knows from the first round what each length costs. What it adds
    is kept apart for plain steps (g = 0) and for rounds that draft: a drafting round pays more than its forwards
    (the drafter's cache, the verifier's features, a longer cache to cut), and one mean for both made drafting look
    cheaper than it is where most rounds are plain steps."""

    min_slope = 0.005  # a verified token is never taken as free: noise must not make the longest draft look best
    prior_rounds = 4  # the weight of `prior` against measured rounds, in rounds

    def __init__(self, prior_slope: float = 0.02, prior=None):
        self.prior_slope = prior_slope
        self.prior = prior
        self.seconds: dict[int, float] = {}
        self.rounds: dict[int, int] = {}
        self._prior_seconds: dict[int, float] = {}  # the prior by length, read once (rounds ask every time)
        self._excess = [0.0, 0.0]  # measured seconds minus the prior's, summed over plain steps and drafting rounds

    def record(self, length: int, seconds: float):
        self.seconds[length] = self.seconds.get(length, 0.0) + seconds
        self.rounds[length] = self.rounds.get(length, 0) + 1
        if self.prior is not None:
            self._excess[length > 0] += seconds - float(self._prior_at(torch.tensor([length]))[0])

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
        """The prior's seconds plus what the loop adds to them: measured seconds minus the prior's, averaged over the
        rounds measured of the same kind (plain steps, drafting rounds) and `prior_rounds` rounds that add nothing."""
        prior = self._prior_at(lengths)
        plain = self.rounds.get(0, 0)
        drafted = sum(self.rounds.values()) - plain
        excess = torch.where(torch.as_tensor(lengths) > 0, self._excess[1] / (drafted + self.prior_rounds),
                             self._excess[0] / (plain + self.prior_rounds))
        return (prior + excess).clamp_min(0.1 * prior).float()

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


class DraftLengthPolicy:
    """Picks the draft length g <= max_length that maximises expected tokens per round, 1 + sum_{m<=g} prod_{i<=m}
    a_i (`AcceptanceRates`), over the measured cost of a round of that length (`RoundCosts`): long drafts where the
    drafter is accepted and verifying more tokens is cheap, short ones where it is rejected or verifying is dear.
    `fixed` pins the length.

    A policy lives one generation: its acceptance is what this generation measured (from a prior that an untried
    first position is accepted half the time); its costs start from this machine's `CostProfile` where one is given.

    A loop that can run a round without a draft (a plain step) asks `next_length(allow_skip=True)`: it may get 0,
    except for a probe round, which drafts 1 token so that acceptance keeps being measured. The first probe comes
    after `probe_every` skipped rounds; each probe after which drafting still does not pay doubles the gap, up to
    `max_probe_every` (a probe costs more than it brings, or it would not be skipping); a drafting round brings the
    gap back to `probe_every`. While it skips, the decision stands until a round drafts (a probe): a skipped round
    adds only a plain step's time, which hardly moves it, and weighing every length costs about 0.3 ms, a few tenths
    of a percent of a step. A loop that cut the whole draft it asked for says so (`decline`): that counts as a skip.

    Without a profile, while it drafts, such a loop takes a plain step now and then to measure what one costs (every
    `probe_every`-th round until `plain_samples` are measured, then every `plain_every`-th): without that, a plain
    step's cost is the drafting rounds' line at g = 0, which still holds the drafter's forward and its round's
    overhead, so skipping looked dearer than it is and a drafter that barely paid kept drafting."""

    probe_every = 8
    max_probe_every = 64
    plain_samples = 4
    plain_every = 64

    def __init__(self, max_length: int, fixed: int | None = None, prior_slope: float = 0.02,
                 costs: RoundCosts | None = None):
        self.max_length = max_length
        self.fixed = fixed
        self.acceptance = AcceptanceRates(max_length)
        self.costs = costs if costs is not None else RoundCosts(prior_slope)
        self.skipped = 0
        self.probe_gap = self.probe_every
        self.skipping = False  # the last decision with allow_skip was 0, and nothing has drafted since
        self.probing = False  # the last decision was a probe: its token is to be verified, whatever it costs
        self.since_plain = 0  # rounds that could have skipped and drafted, since the last plain step

    def next_length(self, allow_skip: bool = False) -> int:
        self.probing = False
        if self.fixed is not None:
            return self.fixed
        if not (allow_skip and self.skipping):
            best = self.best(allow_skip)[0]
            if best and allow_skip and self._measure_plain_step():
                return 0
            if best:
                self.skipped = 0
                return best
            self.skipping = True
        self.skipped += 1
        if self.skipped < self.probe_gap:
            return 0
        self.skipped, self.probe_gap = 0, min(2 * self.probe_gap, self.max_probe_every)
        self.probing = True
        return 1

    def _measure_plain_step(self) -> bool:
        """Whether this round, which would draft, is a plain step taken to measure one (never with a cost prior,
        which knows it)."""
        if self.costs.prior is not None:
            return False
        self.since_plain += 1
        measured = self.costs.rounds.get(0, 0) >= self.plain_samples
        if self.since_plain < (self.plain_every if measured else self.probe_every):
            return False
        self.since_plain = 0
        return True

    def best(self, allow_skip: bool = False) -> tuple[int, float]:
        """The draft length with the most expected tokens per unit of measured round cost (0 only if `allow_skip`),
        and that rate: in tokens per second once a drafting round was timed (`timed`)."""
        lengths = torch.arange(0 if allow_skip else 1, self.max_length + 1)
        rate = self.tokens_per_second(lengths)
        return int(lengths[rate.argmax()]), float(rate.max())

    def tokens_per_second(self, lengths: torch.Tensor) -> torch.Tensor:
        """Expected tokens of a round drafting each of `lengths`, over its predicted cost."""
        expected = 1 + torch.cat([torch.zeros(1), self.acceptance.rates().cumprod(0)]).cumsum(0)[lengths]
        return expected / self.costs.predict(lengths)

    @property
    def timed(self) -> bool:
        """Whether costs are in seconds: a cost prior, or a round that drafted was timed (until then costs, and
        rates, are relative)."""
        return self.costs.prior is not None or any(length > 0 for length in self.costs.rounds)

    def decline(self):
        """The round verified none of the draft this policy asked for (a tree budget judged its tokens too unlikely to
        pay for verifying them): skip until the next probe, as if `next_length` had said 0, the probes' gap kept.
        Otherwise a drafter whose drafts were always cut paid its forward every round and learnt nothing."""
        self.skipping, self.skipped = True, 0

    def update(self, num_drafted: int, num_accepted: int, seconds: float | None = None):
        """Record one round: how many tokens were drafted and accepted, and (if timed) the round's seconds."""
        if num_drafted:
            self.acceptance.update(num_drafted, num_accepted)
            self.skipping = False
            if not self.probing:  # a drafting round: probes start again from the shortest gap
                self.probe_gap = self.probe_every
        if seconds is not None:
            self.costs.record(num_drafted, seconds)


# A drop-in round where drafting does not pay proposes prompt lookup's draft instead: at most this many tokens (as
# transformers' prompt lookup and the tree loop's lookup branch in the shipped method).
LOOKUP_TOKENS = 10


def prompt_lookup(ids: torch.Tensor, num_tokens: int, max_ngram: int = 3) -> list[int]:
    """Prompt lookup's draft from the context `ids` [L] alone: the up to `num_tokens` tokens that followed the latest
    earlier occurrence of the longest n-gram (n <= max_ngram) ending it. (`hf_specdiff.decoding.prompt_lookup`, in a
    file that ships standalone, returns several such drafts.)"""
    for n in range(min(max_ngram, ids.shape[0] - 1), 0, -1):
        hits = (ids[:-1].unfold(0, n, 1) == ids[-n:]).all(-1).nonzero().flatten()
        if len(hits):
            start = int(hits[-1]) + n
            return ids[start:start + num_tokens].tolist()
    return []


def point_mass_scores(draft: torch.Tensor, vocab_size: int) -> tuple[torch.Tensor, ...]:
    """The scores of a draft [1, g] that was not drawn from a distribution (prompt lookup's), one [1, vocab_size]
    per token: 0 at the token, -inf elsewhere. As a point mass q, speculative sampling accepts the token with its
    probability under the verifier and, on rejection, removes it from the target: lossless."""
    scores = torch.full((draft.shape[1], vocab_size), float("-inf"), device=draft.device)
    return tuple(scores.scatter_(1, draft.T, 0.0)[:, None].unbind(0))


class AssistantRounds:
    """What a drafter called by transformers' assisted loop learns between calls, for its `DraftLengthPolicy`.

    The loop tells a drafter nothing back, but each call's `input_ids` start with the previous call's input, then
    the accepted draft tokens: comparing them with the draft gives the accepted count. The time from one call's
    start to the next is a whole round (drafting, the verifier's forward, the loop's bookkeeping). The first round
    is not timed: its verifier forward also reads the prompt.

    With a `lookup_policy`, a round proposes prompt lookup's draft instead of the drafter's where the drafter's
    policy skips drafting (as long as the lookup policy finds it worth verifying) and where the lookup policy expects
    more tokens per second than the drafter's (`next_draft`). Each policy learns from the rounds it drafted; the cost
    of a plain step (a round that drafted nothing) goes to both.
    """

    def __init__(self, policy: DraftLengthPolicy, lookup_policy: DraftLengthPolicy | None = None):
        self.policy, self.lookup_policy = policy, lookup_policy
        self.source = policy  # the policy whose decision the last round followed
        self.draft: torch.Tensor | None = None  # [g] the last draft
        self.start = 0  # length of the input it was drafted after
        self.started_at = 0.0
        self.timed = False

    def observe(self, input_ids: torch.Tensor):
        """Call at the start of a drafting call with its `input_ids` [1, seq]."""
        now = device_clock(input_ids.device)
        if self.draft is not None:
            # the loop appended the accepted draft tokens and one token of the verifier's, which differs from the
            # draft's next token (greedy: the argmax that rejected it; sampling: a draw from a residual without it)
            accepted = min(self.draft.shape[0], input_ids.shape[1] - self.start - 1)
            seconds = now - self.started_at if self.timed else None
            self.source.update(self.draft.shape[0], accepted, seconds)
            if self.lookup_policy is not None and self.draft.shape[0] == 0:
                (self.lookup_policy if self.source is self.policy else self.policy).update(0, 0, seconds)
            self.timed = True
        self.started_at = now

    def next_draft(self, input_ids: torch.Tensor, max_tokens: int, allow_skip: bool) -> tuple[int, list[int]]:
        """This round's draft: how many tokens the drafter drafts, or prompt lookup's draft (one of the two, or
        neither for a plain step). `allow_skip`: whether the caller's loop takes an empty draft; if not, a round
        with neither drafts one token (a probe)."""
        self.source = self.policy
        if self.lookup_policy is None:
            return min(max_tokens, self.policy.next_length(allow_skip=allow_skip)), []
        length = min(max_tokens, self.policy.next_length(allow_skip=True))
        lookup = self._lookup_draft(input_ids, max_tokens, length)
        if lookup:
            self.source = self.lookup_policy
            return 0, lookup
        return (length if length or allow_skip else 1), []

    def _lookup_draft(self, input_ids: torch.Tensor, max_tokens: int, length: int) -> list[int]:
        """Prompt lookup's draft for this round, if it is to replace the drafter's decision `length`: where the
        drafter skips, as long as the lookup policy finds worth verifying; where it drafts (not a probe), the lookup
        policy's best length if that is expected to give more tokens per second, or was never timed (once the
        drafter's rounds were). Neither for a plain step taken to measure one."""
        if length == 0 and self.policy.skipping:
            num_tokens = self.lookup_policy.next_length(allow_skip=True)
        elif length and not self.policy.skipping and self.policy.timed:
            num_tokens, rate = self.lookup_policy.best()
            if self.lookup_policy.timed and rate <= float(self.policy.tokens_per_second(torch.tensor([length]))[0]):
                return []
        else:
            return []
        return prompt_lookup(input_ids[0], min(max_tokens, num_tokens))

    def drafted(self, input_ids: torch.Tensor, draft: torch.Tensor):
        """Call after drafting `draft` [1, g] after `input_ids` [1, seq]."""
        self.draft, self.start = draft[0], input_ids.shape[1]


def unmasking_chunks(num_tokens: int, num_steps: int) -> list[int]:
    """How many positions each denoising step unmasks: `num_tokens` split into at most `num_steps` near-equal chunks."""
    steps = min(num_steps, num_tokens)
    return [num_tokens // steps + (1 if i < num_tokens % steps else 0) for i in range(steps)]


def block_attention_mask(num_new: int, num_cached: int, block_len: int, device) -> torch.Tensor:
    """Boolean mask [1, 1, num_new + block_len, num_cached + num_new + block_len] for one drafting forward.

    New prefix tokens attend causally (to the cache and to earlier new tokens); block tokens attend to the whole
    prefix and to each other.
    """
    q = num_new + block_len
    k = num_cached + q
    mask = torch.ones(q, k, dtype=torch.bool, device=device)
    if num_new:
        mask[:num_new, num_cached:] = torch.ones(num_new, q, dtype=torch.bool, device=device).tril(0)
    return mask[None, None]


def top_p_candidates(probs: torch.Tensor, top_p: float, candidates: int = 1024):
    """The `candidates` most probable tokens of each row of `probs` [rows, vocab] (their probabilities and ids,
    [rows, candidates]) and which of them are in the row's top-p nucleus (the probability ranked above a token is
    under `top_p`). Where a row's last candidate is kept, its nucleus may reach past its candidates."""
    top, ids = probs.topk(min(candidates, probs.shape[-1]), dim=-1)
    return top, ids, top.cumsum(-1) - top < top_p


class CandidateTopPLogitsWarper(TopPLogitsWarper):
    """transformers' `TopPLogitsWarper` for draft positions: the same nucleus (up to rounding at its edge), found among
    the `candidates` most probable tokens instead of by sorting the whole vocabulary, which cost more than a small
    drafter's forward (the whole vocabulary only for a row whose candidates hold less than `top_p`). Lossless: a draft
    token may come from any distribution, as long as its scores are the ones it was drawn from."""

    candidates = 1024

    def __call__(self, input_ids: torch.LongTensor, scores: torch.Tensor) -> torch.Tensor:
        _, ids, keep = top_p_candidates(scores.float().softmax(-1), self.top_p, self.candidates)
        keep[:, :self.min_tokens_to_keep] = True
        kept = torch.where(keep, scores.gather(-1, ids), self.filter_value)
        processed = torch.full_like(scores, self.filter_value).scatter_(-1, ids, kept)
        wide = keep[:, -1]  # rows whose nucleus may reach past their candidates
        if wide.any():
            processed[wide] = super().__call__(input_ids, scores[wide])
        return processed


def draft_processors(logits_processor: LogitsProcessorList) -> LogitsProcessorList:
    """`logits_processor` with its top-p warpers computed among candidates (`CandidateTopPLogitsWarper`)."""
    return LogitsProcessorList(
        CandidateTopPLogitsWarper(p.top_p, p.filter_value, p.min_tokens_to_keep) if type(p) is TopPLogitsWarper else p
        for p in logits_processor)


def select_tokens(scores: torch.Tensor, do_sample: bool, generator: torch.Generator | None = None) -> torch.Tensor:
    """Draw one token per row of processed logits `scores` [n, vocab]: argmax, or a sample of softmax(scores)."""
    if not do_sample:
        return scores.argmax(-1)
    return sample_rows(scores.float().softmax(-1), 1, generator)[:, 0]


def sample_rows(weights: torch.Tensor, num_samples: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """`num_samples` independent draws [rows, num_samples] per row of non-negative `weights` [rows, n], each index
    with probability proportional to its weight: by inverting the cumulative distribution (`torch.multinomial` cost
    about 1 ms a row of 49k here, this 0.04 ms)."""
    cdf = weights.double().cumsum(-1)
    u = torch.rand(weights.shape[0], num_samples, generator=generator, dtype=torch.float64, device=weights.device)
    return torch.searchsorted(cdf, u * cdf[:, -1:], right=True).clamp_max(weights.shape[-1] - 1)


@torch.no_grad()
def draft_block(
    drafter,
    input_ids: torch.Tensor,
    cache: SpecDiffCache,
    num_tokens: int,
    logits_processor: LogitsProcessorList,
    do_sample: bool,
    num_steps: int,
    schedule: str = "left_to_right",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Denoise the first `num_tokens` positions of a block of mask tokens after `input_ids` ([1, seq]).

    The block is as long as the drafter was trained on (`max_draft_tokens`) however few tokens are drafted: attention is
    bidirectional inside it, so a shorter block would change what every position sees. Returns the draft
    [1, num_tokens] and, for each draft token, the processed logits it was drawn from [num_tokens, vocab] (float32).
    """
    config = drafter.config
    device = input_ids.device
    logits_processor = draft_processors(logits_processor)
    block_len = max(num_tokens, config.max_draft_tokens)
    step_forward = (_conditioned_forward if config.is_conditioned else _standalone_forward)(
        drafter, input_ids, cache, num_tokens, block_len)
    block = torch.full((1, block_len), config.mask_token_index, dtype=torch.long, device=device)
    decided = torch.zeros(num_tokens, dtype=torch.bool, device=device)
    scores = torch.empty(num_tokens, config.vocab_size, dtype=torch.float32, device=device)
    if do_sample and schedule == "confidence":
        schedule = "left_to_right"  # confidence order depends on sampled values: biased for sampling

    first = 0  # left to right: the chunk's first position, known without asking the device
    for step, chunk in enumerate(unmasking_chunks(num_tokens, num_steps)):
        logits = step_forward(block, step == 0)
        if schedule == "confidence":
            confidence = logits.max(-1).values.masked_fill(decided, float("-inf"))
            positions_now = confidence.topk(chunk).indices.sort().values
            decided_left = int(decided.long().cumprod(0).sum())  # a host sync: the order depends on the logits
        else:
            positions_now = torch.arange(first, first + chunk, device=device)
            decided_left, first = first, first + chunk
        context_len = input_ids.shape[1] + decided_left  # ids decided left of the chunk
        context = torch.cat([input_ids, block], dim=1)[:, :context_len].expand(chunk, -1)
        step_scores = logits_processor(context, logits[positions_now])
        block[0, positions_now] = select_tokens(step_scores, do_sample)
        scores[positions_now] = step_scores
        decided[positions_now] = True
    return block[:, :num_tokens], scores


def _standalone_forward(drafter, input_ids, cache, num_tokens, block_len):
    """One denoising forward of a standalone drafter over a block of `block_len` tokens, returning the logits of its
    first `num_tokens`: the first step also encodes the uncached prefix tokens."""
    config = drafter.config
    device = input_ids.device
    new_ids = cache.sync(input_ids[0], config.drafting_window - block_len, block_len)
    start = cache.get_seq_length() - cache.offset  # position of the first block token, relative to the window
    block_positions = torch.arange(start, start + block_len, device=device)

    def forward(block, first):
        num_new = new_ids.shape[0] if first else 0
        query = torch.cat([new_ids[None], block], dim=1) if num_new else block
        positions = torch.cat([torch.arange(start - num_new, start, device=device), block_positions])
        return drafter(
            input_ids=query,
            position_ids=positions[None],
            attention_mask=block_attention_mask(num_new, start - num_new, block_len, device),
            past_key_values=cache,
            num_prefix_tokens=num_new,
            logits_to_keep=slice(num_new, num_new + num_tokens),
        ).logits[0].float()

    return forward


def _conditioned_forward(drafter, input_ids, cache, num_tokens, block_len):
    """One denoising forward of a conditioned drafter over a block of `block_len` tokens, returning the logits of its
    first `num_tokens`.

    The context is the verifier's features at the committed tokens it has read, except the last token (the anchor,
    which opens the block); the first step caches the context rows not cached yet. Tokens without features (only
    on a first round, before the verifier has read the prompt) join the anchor, at most `block_len` of them.
    """
    config = drafter.config
    device = input_ids.device
    store = cache.verifier_features
    length = input_ids.shape[1]
    read = min(store.usable_length(input_ids[0]), length - 1)
    new_ids = cache.sync(input_ids[0, :read], config.drafting_window - block_len - 1, block_len)
    num_new = new_ids.shape[0]
    width = len(config.verifier_layer_ids) * config.verifier_hidden_size
    features = store.features[read - num_new : read] if num_new else torch.zeros(0, width)
    features = features.to(device)[None]
    first_anchor = max(read, length - block_len)
    anchors = input_ids[:, first_anchor:]
    context_positions = torch.arange(read - num_new, read, device=device) - cache.offset
    query_positions = torch.arange(first_anchor, length + block_len, device=device) - cache.offset
    keep = slice(anchors.shape[1], anchors.shape[1] + num_tokens)

    def forward(block, first):
        positions = torch.cat([context_positions, query_positions]) if first and num_new else query_positions
        return drafter(
            input_ids=torch.cat([anchors, block], dim=1),
            verifier_features=features if first else features[:, :0],
            position_ids=positions[None],
            past_key_values=cache,
            logits_to_keep=keep,
        ).logits[0].float()

    return forward


__all__ = ["SpecDiffCache", "VerifierFeatures", "VerifierHooks", "AcceptanceRates", "RoundCosts", "DraftLengthPolicy",
           "AssistantRounds", "decoder_layers", "unmasking_chunks", "block_attention_mask", "select_tokens", "draft_block"]
