"""SpecDiff-2 decoding: diffusion drafts verified by the verifier, with self-selection over K drafts.

Entry points (the same loop):
    model.generate(**inputs, custom_generate=specdiff_generate, drafter=drafter, num_drafts=8)
    generate(model, drafter, **inputs, num_drafts=8, lookup_tokens=10)

Every call runs one loop, `TreeDecoding`. With K > 1, or a prompt-lookup branch (`lookup_tokens` > 0), it runs
self-selection: one drafter forward gives per-position marginals q_1..q_g; K drafts are drawn from them and merged,
with the lookup drafts, into a prefix tree; one verifier forward scores every tree node (4D tree attention mask, one
position id per node); the verifier's cache is then compacted to the accepted path. With K = 1 and no lookup branch
the tree is one draft, drafted in the drafter's own denoising steps: a chain, verified as plain decoding verifies
tokens (the model's own causal mask, so any attention implementation serves), as is a round that drafts nothing.

Why the output is exactly the verifier's:
- Greedy: the walk from the root follows the child equal to the verifier's argmax, and stops with the argmax as
  the bonus token. Every emitted token is the verifier's argmax given the tokens before it.
- Sampling: the drafts are K independent draws from the product of marginals q_1 x ... x q_g, which depend on the
  committed prefix only. At a tree node of depth d, the drafts passing through it carry next tokens that are
  independent draws from q_{d+1}, whatever happened at depths <= d. That is the setting of multi-candidate
  speculative sampling (SpecInfer, Miao et al. 2024, Theorem 4.2): try the draws in order, accept draw x with
  probability min(1, p(x)/q(x)) where p is the current target, and on rejection replace p by
  norm(max(p - q, 0)). If a draw is accepted, the emitted token is distributed as the target and the walk goes on
  at that child; if all are rejected, a token from the last residual is distributed as the target too. Repeated
  draws of an already rejected token are tried again (they are rejected with probability 1, since p(x) < q(x)
  held when it was rejected and the residual puts no mass on it) and still update the residual, so the
  multiplicity of draws is respected even though the tree stores each prefix once.
- A prompt-lookup draft (`lookup_tokens`; `num_lookup_drafts` of them) is a function of the committed tokens alone,
  so at each node it passes through it is one more independent draw, from a point mass: accepted with probability
  p(x) under the current target, and on rejection the target loses x (the same rule with q = one-hot(x)).
- How long the draws are and how much of each lookup draft the tree keeps (`sampling_plan`) is decided from earlier
  rounds before anything is drawn, and applies to every draw alike: no draw is kept or cut for its own tokens.

This file imports only torch and transformers, so it also ships as a Hub `custom_generate/generate.py`.
"""

import inspect
import math
import os
import time
from collections import defaultdict
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field

import torch

from transformers import GenerationMixin
from transformers.generation.stopping_criteria import (
    EosTokenCriteria,
    MaxLengthCriteria,
    StoppingCriteriaList,
    StopStringCriteria,
)
from transformers.generation.utils import GenerateDecoderOnlyOutput
from transformers.utils import logging


# transformers 5.24 renamed the cache argument of models and `generate` from `past_key_values` to `cache` (the old
# name is still taken, with a warning); the tree loop reads and passes it under the name of the version installed.
CACHE_KWARG = "cache" if "cache" in GenerateDecoderOnlyOutput.__dataclass_fields__ else "past_key_values"

logger = logging.get_logger(__name__)

# Trees verify at most this many nodes unless max_tree_nodes says otherwise: with the last committed token, a
# verifier forward over 16 positions. What that costs depends on the hardware (docs/tuning.md; measured in bf16 on 2
# CPU cores: 1.38x a 1-token forward with AVX512-BF16, 6x with AVX2 only), so by default each round sizes its tree
# by measured round costs (`tree_budget`). On a GPU a larger tree is almost free: pass a larger max_tree_nodes.
DEFAULT_MAX_TREE_NODES = 15

# A tree with a lookup branch holds the distinct continuations of the latest this many matches: in the tree, the
# verifier keeps whichever agrees longest (docs/benchmarks.md: tau and speed against a single lookup draft).
DEFAULT_NUM_LOOKUP_DRAFTS = 4

# The lookup drafts' acceptance counts are multiplied by this before each round's update: a lookup draft is accepted
# while the output copies a passage and not once it stops, and with every round weighed alike the rates a long copy
# built kept 7-10 useless lookup nodes in each tree for many rounds after it. Modeled on three machines' costs
# (`experiments/modeled_speedup.py`, docs/benchmarks.md), 0.8 was faster than no decay on each.
LOOKUP_ACCEPTANCE_DECAY = 0.8


def device_clock(device: torch.device | str) -> float:
    """`time.perf_counter()` once the work queued on `device` has run (a copy of `costs_specdiff.device_clock`:
    this file also ships alone). Rounds are timed where the loop waits for the device anyway, so it adds no stall."""
    device = torch.device(device)
    backend = getattr(torch, device.type, None) if device.type != "cpu" else None
    if backend is not None and hasattr(backend, "synchronize"):
        backend.synchronize() if device.type == "mps" else backend.synchronize(device)
    return time.perf_counter()


def host_to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A small host tensor (tree structure, positions, token ids) on `device` without a host sync: a copy from
    pageable memory to a GPU waits for the device to catch up; one from pinned memory is queued behind its work."""
    if torch.device(device).type == "cuda":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)


@dataclass
class SpecDiffStats:
    """What one generation did: rounds (verifier forwards), tokens, and acceptance by draft position."""

    rounds: int = 0
    new_tokens: int = 0
    drafter_forwards: int = 0
    shadow_probes: int = 0  # drafts made to measure acceptance and not verified (`TreeDecoding.shadow_probe`)
    drafted: list[int] = field(default_factory=list)  # drafted[i]: rounds that drafted position i
    accepted: list[int] = field(default_factory=list)  # accepted[i]: rounds that accepted position i

    @property
    def tau(self) -> float:
        """Mean tokens per verifier forward (accepted draft tokens plus the bonus token)."""
        return self.new_tokens / max(self.rounds, 1)

    @property
    def acceptance_by_position(self) -> list[float]:
        return [a / d for a, d in zip(self.accepted, self.drafted) if d]

    def record_round(self, num_drafted: int, num_accepted: int):
        self.rounds += 1
        grow = num_drafted - len(self.drafted)
        if grow > 0:
            self.drafted += [0] * grow
            self.accepted += [0] * grow
        for i in range(num_drafted):
            self.drafted[i] += 1
            self.accepted[i] += i < num_accepted

    def as_dict(self) -> dict:
        return {"rounds": self.rounds, "new_tokens": self.new_tokens, "tau": self.tau,
                "drafter_forwards": self.drafter_forwards, "shadow_probes": self.shadow_probes,
                "acceptance_by_position": self.acceptance_by_position}


# ----------------------------------------------------------------------------------------------------------------
# The draft tree


@dataclass
class DraftTree:
    """Unique prefixes of K drafts. Node n has `tokens[n]`, `parents[n]` (-1: the last committed token) and
    `depths[n]` (1-based); `draws[v]` lists, for parent v, the (token, child, fixed) of every draft through v, in draw
    order; `fixed` marks a draft that is not a draw from the drafter (a prompt-lookup continuation)."""

    tokens: torch.Tensor
    parents: list[int]
    depths: torch.Tensor
    draws: dict[int, list[tuple[int, int, bool]]]
    ancestors: torch.Tensor  # [N, N] bool: ancestors[n, u] = u is n or an ancestor of n
    fixed_only: set[int]  # nodes that only fixed drafts pass through
    max_depth: int = 0

    @classmethod
    def from_drafts(cls, drafts, fixed: list[list[int]] = ()) -> "DraftTree":
        """Build the tree of `drafts` ([K, g] tensor, or rows of any length) followed by the `fixed` rows."""
        rows = [(row, False) for row in (drafts.tolist() if torch.is_tensor(drafts) else drafts)]
        rows += [(row, True) for row in fixed if row]
        index: dict[tuple, int] = {}
        tokens, parents, depths = [], [], []
        draws: dict[int, list[tuple[int, int, bool]]] = {}
        drafted: set[int] = set()
        for row, is_fixed in rows:
            parent = -1
            for depth in range(1, len(row) + 1):
                key = tuple(row[:depth])
                if key not in index:
                    index[key] = len(tokens)
                    tokens.append(row[depth - 1])
                    parents.append(parent)
                    depths.append(depth)
                draws.setdefault(parent, []).append((row[depth - 1], index[key], is_fixed))
                parent = index[key]
                if not is_fixed:
                    drafted.add(parent)
        n = len(tokens)
        ancestors = torch.eye(n, dtype=torch.bool)
        for node in range(n):  # parents come before children
            if parents[node] >= 0:
                ancestors[node] |= ancestors[parents[node]]
        return cls(torch.tensor(tokens, dtype=torch.long), parents, torch.tensor(depths, dtype=torch.long), draws,
                   ancestors, set(range(n)) - drafted, max(depths, default=0))

    def __len__(self) -> int:
        return len(self.parents)

    @property
    def is_chain(self) -> bool:
        """One draft (or none): each node's parent is the node before it, so the tree's mask is the causal one."""
        return self.parents == list(range(-1, len(self.parents) - 1))

    def path(self, node: int) -> list[int]:
        """Nodes from the root's child down to `node`."""
        out = []
        while node >= 0:
            out.append(node)
            node = self.parents[node]
        return out[::-1]


def top_k_drafts(log_q: torch.Tensor, k: int) -> tuple[list[list[int]], list[list[float]]]:
    """The k most probable sequences (k' <= k rows of g tokens) under the product of the marginals exp(log_q) [g, V],
    and each row's log-probabilities of its prefixes. One transfer from the device: the k best tokens per position."""
    width = min(k, log_q.shape[1])  # a best sequence only uses each position's k best tokens
    top = log_q.topk(width, dim=-1)
    rows = torch.cat([top.values.double(), top.indices.double()], dim=-1).tolist()
    values, tokens = [row[:width] for row in rows], [row[width:] for row in rows]
    beams = [((), ())]  # (tokens, prefix log-probabilities)
    for position_values, position_tokens in zip(values, tokens):  # beam search, k wide
        candidates = sorted(((beam + (int(token),), scores + ((scores[-1] if scores else 0.0) + value,))
                             for beam, scores in beams for value, token in zip(position_values, position_tokens)),
                            key=lambda c: -c[1][-1])
        beams = [c for c in candidates[:k] if c[1][-1] > float("-inf")]
    return [list(beam) for beam, _ in beams], [list(scores) for _, scores in beams]


def _ranked_prefixes(rows: list[list[int]], path_scores: list[list[float]]) -> list[tuple[tuple, float]]:
    """Every prefix of `rows` with its probability of acceptance, best first (ties: shallower first): the best its
    rows give it, made coherent (`_coherent`)."""
    best: dict[tuple, float] = {}
    for row, row_scores in zip(rows, path_scores):
        for depth, score in enumerate(row_scores, start=1):
            key = tuple(row[:depth])
            best[key] = max(best.get(key, float("-inf")), math.exp(score))
    return sorted(_coherent(best).items(), key=lambda item: (-item[1], len(item[0])))


def _coherent(probs: dict[tuple, float]) -> dict[tuple, float]:
    """Prefix probabilities in which a node's children, exclusive events (the verifier takes one token after it),
    sum to at most the node's own: each child first scaled as its parent was, then siblings that sum to more scaled
    down together. Rows from different sources (the drafter's marginals, each lookup draft's measured rates) give
    siblings that sum to more than 1: a math answer's lookup drafts priced three nodes at 0.72, 0.60 and 0.59 where
    they brought one token a round, and made rounds of 3 nodes that did not pay on an AVX2-only CPU."""
    coherent, factor = {(): 1.0}, {(): 1.0}
    by_depth = defaultdict(list)
    for key in probs:
        by_depth[len(key)].append((key, key[:-1]))
    for depth in sorted(by_depth):  # parents before their children
        level, total = by_depth[depth], defaultdict(float)
        for key, parent in level:
            total[parent] += probs[key] * factor[parent]
        for key, parent in level:
            p = probs[key] * factor[parent] * min(1.0, coherent[parent] / max(total[parent], 1e-30))
            coherent[key], factor[key] = p, (p / probs[key] if probs[key] > 0 else 0.0)
    del coherent[()]
    return coherent


def prune_drafts(rows: list[list[int]], path_scores: list[list[float]], max_nodes: int,
                 costs=None) -> list[list[int]]:
    """Cut `rows` so that their tree keeps only the `max_nodes` prefixes of highest score. `path_scores[r][d]` is
    the log-probability that prefix `rows[r][:d + 1]` is accepted, so it never grows along a row and the kept set is
    a tree. For greedy verification, where a node costs verifier compute but only the argmax path counts. With
    `costs` (`RoundCosts`), `max_nodes` is a cap and `tree_budget` picks how many to keep."""
    ranked = _ranked_prefixes(rows, path_scores)
    if costs is not None:
        max_nodes = tree_budget([p for _, p in ranked], costs, max_nodes)
    kept = {key for key, _ in ranked[:max_nodes]}
    out = []
    for row in rows:
        depth = 0
        while depth < len(row) and tuple(row[:depth + 1]) in kept:
            depth += 1
        out.append(row[:depth])
    return out


def tree_budget(probs: list[float], costs, max_nodes: int) -> int:
    """How many nodes a greedy round should verify, given the acceptance probabilities of the candidate nodes best
    first: the n <= max_nodes that maximises expected tokens, 1 + the n best probabilities summed, over
    `costs.predict(n)`, the measured cost of a round that verifies n nodes (`RoundCosts`). 0 makes the round a plain
    decoding step."""
    gains = torch.tensor([0.0] + list(probs[:max_nodes]), dtype=torch.float64)
    sizes = torch.arange(len(gains))
    return int(sizes[((1 + gains.cumsum(0)) / costs.predict(sizes.float()).double()).argmax()])


def sampling_plan(draft_rates: torch.Tensor, num_drafts: int, lookup_rates: list[torch.Tensor], costs,
                  max_nodes: int) -> tuple[int, list[int]]:
    """For a sampling round, decided before anything is drawn (cutting a draw by its own tokens would bias it): how
    many tokens each of the `num_drafts` drafter draws gets and how deep each lookup draft is kept. `draft_rates[i]`
    and `lookup_rates[r][i]` are the measured rates of acceptance at depth i + 1 once depth i was accepted; a drafter
    depth costs `num_drafts` nodes, a lookup depth one. Depths are taken by expected tokens per node, as many as
    maximise expected tokens over `costs.predict(nodes)` (`RoundCosts`) within `max_nodes`; without `costs`, as
    many as fit. The drafter's first depth, if it may draft, is always taken: its acceptance keeps being measured."""
    units = [(float(p) / num_drafts, num_drafts, -1) for p in draft_rates.cumprod(0)]
    for rank, rates in enumerate(lookup_rates):
        units += [(float(p), 1, rank) for p in rates.cumprod(0)]
    first = 1 if draft_rates.numel() else 0
    units = units[:first] + sorted(units[first:], key=lambda unit: -unit[0])  # stable: depths stay in order
    nodes = torch.tensor([0] + [n for _, n, _ in units]).cumsum(0)
    gains = torch.tensor([0.0] + [gain * n for gain, n, _ in units], dtype=torch.float64).cumsum(0)
    value = (1 + gains) / costs.predict(nodes.float()).double() if costs is not None else nodes.double()
    value[nodes > max_nodes] = float("-inf")
    count = first + int(value[first:].argmax())
    chosen = [source for _, _, source in units[:count]]
    return chosen.count(-1), [chosen.count(rank) for rank in range(len(lookup_rates))]


def sample_drafts(scores: torch.Tensor, k: int) -> torch.Tensor:
    """k independent draws [k, g] from the product of the marginals softmax(scores) [g, V], by inverting the
    cumulative distribution as `generation_specdiff.sample_rows` does (multinomial cost ~1 ms a row): a copy, as this
    file also ships alone (`custom_generate`) and imports only torch and transformers."""
    cdf = scores.float().softmax(-1).double().cumsum(-1)
    u = torch.rand(cdf.shape[0], k, dtype=torch.float64, device=cdf.device) * cdf[:, -1:]
    return torch.searchsorted(cdf, u, right=True).clamp_max(cdf.shape[-1] - 1).T


def prompt_lookup(ids: torch.Tensor, num_tokens: int, num_drafts: int = 1, max_ngram: int = 3) -> list[list[int]]:
    """Prompt-lookup decoding's drafts, made from the context `ids` [L] alone: the up to `num_tokens` tokens that
    followed each earlier occurrence of the longest n-gram (n <= max_ngram) ending it, latest first, up to
    `num_drafts` distinct ones."""
    for n in range(min(max_ngram, ids.shape[0] - 1), 0, -1):
        windows = ids[:-1].unfold(0, n, 1)  # every n-gram that has a token after it
        hits = (windows == ids[-n:]).all(-1).nonzero().flatten().tolist()
        drafts = []
        for start in reversed(hits):
            draft = ids[start + n:start + n + num_tokens].tolist()
            if draft not in drafts:
                drafts.append(draft)
                if len(drafts) == num_drafts:
                    break
        if drafts:
            return drafts
    return []


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """The target after a rejected draw: norm(max(p - q, 0)) (p itself if p == q to rounding)."""
    rest = (p - q).clamp_min(0)
    total = rest.sum()
    return rest / total if total > 0 else p


def accept_sampling(tree: DraftTree, target_scores, draft_probs: torch.Tensor):
    """Multi-candidate speculative sampling down the tree.

    `target_scores` ([1 + N, V] or `TargetScores`): the verifier's processed logits at the last committed token (row
    0) and at each node (row 1 + n). `draft_probs` [g, V]: the drafts' per-depth distributions; a fixed draft (prompt
    lookup) is a draw from a point mass. Returns (accepted nodes, next token).
    """
    node, depth = -1, 0
    p = target_scores[0].float().softmax(-1)
    while True:
        for token, child, fixed in tree.draws.get(node, []):
            q = _point_mass(token, p) if fixed else draft_probs[depth]
            if torch.rand(()) * q[token] <= p[token]:  # accept with probability min(1, p/q)
                node, depth = child, depth + 1
                p = target_scores[1 + node].float().softmax(-1)
                break
            p = residual(p, q)
        else:
            return tree.path(node), int(torch.multinomial(p, 1))


def _point_mass(token: int, like: torch.Tensor) -> torch.Tensor:
    """One-hot at `token`, shaped like the distribution `like`, written on its device (no host copy)."""
    q = torch.zeros_like(like)
    q[token] = 1.0
    return q


def accept_greedy(tree: DraftTree, target_scores):
    """Follow the verifier's argmax down the tree. Returns (accepted nodes, bonus token). Unprocessed logits (a
    tensor) come to the host in one transfer, every row's argmax; processed ones (`TargetScores`) row by row."""
    argmax = target_scores.argmax(-1).tolist() if torch.is_tensor(target_scores) else None
    node = -1
    while True:
        best = argmax[1 + node] if argmax is not None else int(target_scores[1 + node].argmax())
        child = next((c for token, c, _ in tree.draws.get(node, []) if token == best), None)
        if child is None:
            return tree.path(node), best
        node = child


# ----------------------------------------------------------------------------------------------------------------
# Verifier side: tree attention and cache compaction


def _layer_types(verifier) -> list[str] | None:
    return getattr(verifier.config.get_text_config(), "layer_types", None)


def tree_positions(past: int, num_committed: int, tree: DraftTree) -> torch.Tensor:
    """Positions of one tree forward's queries: the uncommitted prefix tokens, then each node at its depth."""
    return torch.cat([torch.arange(past, past + num_committed), past + num_committed - 1 + tree.depths])


def tree_attention_mask(verifier, cache, num_committed: int, tree: DraftTree, dtype,
                        positions: torch.Tensor) -> torch.Tensor | dict:
    """Additive 4D mask(s) for one verifier forward over [uncommitted prefix tokens, tree nodes], built on the
    verifier's device (only the tree's small ancestor matrix is copied there).

    `positions` are the queries' positions on the verifier's device (`tree_positions`). Prefix queries attend
    causally; a node attends to the whole prefix and to its ancestors and itself. Models
    with sliding-window layers get one mask per layer type, cut to the keys each layer type holds.
    """
    device = verifier.device
    num_query = num_committed + len(tree)
    past = cache.get_seq_length()
    allowed = torch.ones(num_query, past + num_query, dtype=torch.bool, device=device)
    allowed[:num_committed, past:] = torch.ones(num_committed, num_query, dtype=torch.bool, device=device) \
        .tril()
    allowed[num_committed:, past + num_committed:] = host_to_device(tree.ancestors, device)
    key_positions = torch.cat([torch.arange(past + num_committed, device=device), positions[num_committed:]])

    def build(layer_idx: int, window: int | None):
        layers = getattr(cache, "layers", [])
        kv_length, kv_offset = layers[layer_idx].get_mask_sizes(num_query) if layer_idx < len(layers) \
            else (past + num_query, 0)
        mask = allowed[:, kv_offset:kv_offset + kv_length]
        if window is not None:
            mask = mask & (key_positions[None, kv_offset:kv_offset + kv_length] > positions[:, None] - window)
        additive = torch.zeros(mask.shape, dtype=dtype, device=device).masked_fill(~mask, torch.finfo(dtype).min)
        return additive[None, None]

    types = _layer_types(verifier)
    if not types:
        return build(0, None)
    window = getattr(verifier.config.get_text_config(), "sliding_window", None)
    return {kind: build(types.index(kind), window if kind == "sliding_attention" else None) for kind in set(types)}


def tree_forward(verifier, cache, input_ids: torch.LongTensor, num_committed: int, tree: DraftTree, **kwargs):
    """The verifier's forward over `input_ids` [1, num_committed + len(tree)], the uncommitted prefix tokens then the
    tree's nodes, after `cache`: a position per node, the tree's attention mask (`tree_attention_mask`)."""
    positions = host_to_device(tree_positions(cache.get_seq_length(), num_committed, tree), input_ids.device)
    mask = tree_attention_mask(verifier, cache, num_committed, tree, verifier.dtype, positions)
    with grouped_heads_in_sdpa(verifier), tree_attention_kernels(verifier):
        return verifier(input_ids=input_ids, position_ids=positions[None], attention_mask=mask, **{CACHE_KWARG: cache},
                        **kwargs)


def compact_cache(cache, num_tree: int, keep: list[int]):
    """Drop the tree nodes not in `keep` (indices into the last `num_tree` cache entries): the kept entries move up
    in place (unless they are already the first ones), then the cache's own `crop` removes the rest (and trims
    sliding-window layers back to their window; the loop activated their past recording)."""
    if keep != list(range(len(keep))):
        moves = torch.tensor(keep, dtype=torch.long)
        on_device = {}  # `moves` copied once to each device the layers live on
        for layer in cache.layers:
            if not layer.is_initialized:
                continue
            base, device = layer.keys.shape[-2] - num_tree, layer.keys.device
            if device not in on_device:
                on_device[device] = host_to_device(moves, device)
            index = base + on_device[device]
            layer.keys[..., base:base + len(keep), :] = layer.keys[..., index, :]
            layer.values[..., base:base + len(keep), :] = layer.values[..., index, :]
    cache.crop(-(num_tree - len(keep)))


@contextmanager
def grouped_heads_in_sdpa(verifier):
    """Let sdpa attend over grouped key/value heads under a mask, inside this block, for a verifier on CPU.

    For a masked multi-token call transformers copies every layer's cached keys and values up to the number of query
    heads (`repeat_kv`), to keep CUDA off its math kernel; on CPU, sdpa takes grouped heads with any mask
    (`enable_gqa`, same output), which spares that copy: about 4 ms of a tree forward of SmolLM2-135M over an
    800-token context. transformers reads `TRANSFORMERS_SDPA_FORCE_GQA` at each call; a value set by the user wins.
    """
    if verifier.device.type != "cpu" or "TRANSFORMERS_SDPA_FORCE_GQA" in os.environ:
        yield
        return
    os.environ["TRANSFORMERS_SDPA_FORCE_GQA"] = "1"
    try:
        yield
    finally:
        del os.environ["TRANSFORMERS_SDPA_FORCE_GQA"]


@contextmanager
def tree_attention_kernels(verifier):
    """On a CUDA verifier, inside this block, sdpa attends under a tree mask with its memory-efficient kernel (or the
    math one), not cuDNN's. cuDNN plans each new (query, key, mask) shape, and a tree forward's shapes change every
    round: measured on an H200 (SmolLM2-135M, bf16), 0.73 ms of host time per attention call in a tree forward
    against 0.06 ms in a plain step, 100 ms per verifier forward against 31 (docs/scaling.md)."""
    if verifier.device.type != "cuda":
        yield
        return
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]):
        yield


def _check_tree_support(verifier):
    implementation = getattr(verifier.config, "_attn_implementation", "eager") or "eager"
    if getattr(verifier, "_is_stateful", False) or implementation.startswith(("flash", "flex")):
        raise ValueError(
            f"Self-selection (num_drafts > 1) verifies a tree with a custom 4D attention mask, which "
            f"{type(verifier).__name__} with attn_implementation={implementation!r} does not take. Load the verifier with "
            "attn_implementation='sdpa' (or 'eager'), or use num_drafts=1."
        )


# ----------------------------------------------------------------------------------------------------------------
# The decoding loops


def _stop_index(input_ids: torch.Tensor, start: int, stopping_criteria) -> int | None:
    """The first length > start at which the stopping criteria fire, replaying them token by token."""
    for length in range(start + 1, input_ids.shape[1] + 1):
        if bool(stopping_criteria(input_ids[:, :length], None).any()):
            return length
    return None


class HostStops:
    """The stopping rule of a generation whose criteria are all maximum length and end-of-sequence tokens (what
    `generate` builds unless asked for more), checked on token ids the host already has: no device sync per token.
    `from_criteria` returns None for any other criterion, which is then replayed on the device (`_stop_index`)."""

    def __init__(self, max_length: int | None, eos_token_ids: set[int]):
        self.max_length, self.eos_token_ids = max_length, eos_token_ids

    @classmethod
    def from_criteria(cls, stopping_criteria) -> "HostStops | None":
        if not all(isinstance(c, (MaxLengthCriteria, EosTokenCriteria)) for c in stopping_criteria):
            return None
        lengths = [c.max_length for c in stopping_criteria if isinstance(c, MaxLengthCriteria)]
        eos = set()
        for criterion in stopping_criteria:
            if isinstance(criterion, EosTokenCriteria):  # one read per generation
                eos.update(torch.as_tensor(criterion.eos_token_id).flatten().tolist())
        return cls(min(lengths, default=None), eos)

    def stop_index(self, new_tokens: list[int], start: int) -> int | None:
        """The first length > start at which generation stops, `new_tokens` appended after `start` tokens."""
        for length, token in enumerate(new_tokens, start=start + 1):
            if token in self.eos_token_ids or (self.max_length is not None and length >= self.max_length):
                return length
        return None


class TargetScores:
    """The verifier's logits at the last committed token (row 0) and at each tree node (row 1 + n), processed by
    the logits processors row by row when first read. Acceptance reads only the rows on the accepted path, and a
    processor such as top-p sorts the whole vocabulary, so a round pays for about tau rows, not for every node."""

    def __init__(self, logits: torch.Tensor, input_ids: torch.LongTensor, tree: DraftTree, tokens: torch.Tensor,
                 logits_processor):
        self.logits, self.input_ids, self.tree, self.tokens = logits, input_ids, tree, tokens
        self.logits_processor = logits_processor
        self.rows: dict[int, torch.Tensor] = {}

    def __getitem__(self, row: int) -> torch.Tensor:
        if row not in self.rows:
            path = self.tokens[self.tree.path(row - 1)] if row else self.tokens[:0]
            context = torch.cat([self.input_ids, path[None]], dim=1)
            self.rows[row] = self.logits_processor(context, self.logits[row][None])[0]
        return self.rows[row]


@dataclass
class TreeRound:
    """One round of the tree loop: what was drafted, and where the verifier's forward starts."""

    committed: torch.Tensor  # [1, c] the committed tokens the verifier has not read yet
    past: int  # the verifier's cache length before this round
    lookups: list[list[int]]  # the prompt-lookup drafts as proposed (the tree holds what pruning kept of them)
    drafts: list | torch.Tensor  # the drafter's drafts in the tree (possibly pruned)
    draft_scores: torch.Tensor | None  # [g, V] the drafter's processed logits; None if it did not draft
    tree: DraftTree
    tokens: torch.Tensor  # [N] the tree's node tokens, on the verifier's device
    started: float  # time.perf_counter() at the round's start


def lookup_acceptance_rates(drafter, max_length: int, first_prior: float):
    """A lookup draft's acceptance counts from `drafter.new_acceptance_rates`, recent rounds weighed more
    (`LOOKUP_ACCEPTANCE_DECAY`). A drafter whose remote code predates the decay (this file ships apart from it, as
    `custom_generate`) takes no `decay`: its rates weigh every round alike, as the loop then did."""
    if "decay" in inspect.signature(drafter.new_acceptance_rates).parameters:
        return drafter.new_acceptance_rates(max_length, first_prior=first_prior, decay=LOOKUP_ACCEPTANCE_DECAY)
    logger.warning_once(f"this drafter's remote code ({type(drafter).__name__}) predates the lookup drafts' recency "
                        "weighting: its lookup branch weighs every round alike. Download the drafter folder again.")
    return drafter.new_acceptance_rates(max_length, first_prior=first_prior)


class TreeDecoding:
    """Self-selection decoding in named steps: `draft_tree` (with a `shadow_probe` where the length policy asks for
    one), `verify`, `target_scores`, `accept`, `learn`, `record_features`, `commit`; `__call__` runs them until a
    stopping criterion fires."""

    def __init__(self, verifier, drafter, generation_config, logits_processor, stopping_criteria, *, num_drafts: int,
                 draft_length: int | None, lookup_tokens: int, num_lookup_drafts: int, max_tree_nodes: int | None,
                 streamer, stats, cost_profile=None):
        if num_drafts > 1 or lookup_tokens:
            _check_tree_support(verifier)
        self.verifier, self.drafter = verifier, drafter
        self.generation_config = generation_config
        self.logits_processor, self.stopping_criteria = logits_processor, stopping_criteria
        self.num_drafts, self.lookup_tokens, self.max_tree_nodes = num_drafts, lookup_tokens, max_tree_nodes
        self.num_lookup_drafts = num_lookup_drafts if lookup_tokens else 0
        self.streamer, self.stats = streamer, stats
        self.do_sample = bool(generation_config.do_sample)
        self.conditioned = drafter.config.is_conditioned
        self.cost_profile = cost_profile
        self.length_policy = drafter.new_length_policy(fixed=draft_length, profile=cost_profile)
        self.round_costs = drafter.new_round_costs(cost_profile)  # of greedy rounds by nodes verified, for tree_budget
        # by depth, for the latest match's draft, the one before it, ...: an untried one at 0.5 / (rank + 1), as an
        # older match is less likely to continue as the text does (at 0.5 each, 2-3 untried drafts of one summary's
        # rounds summed to a tree that cost twice a plain step and brought half a token); recent rounds weigh more
        self.lookup_acceptance = [lookup_acceptance_rates(drafter, lookup_tokens, first_prior=0.5 / (rank + 1))
                                  for rank in range(self.num_lookup_drafts)]
        self.drafter_cache = drafter.new_cache()
        # greedy probes may draft without verifying (none with a drafter whose remote code predates them)
        self.shadow_probes = not self.do_sample and hasattr(self.length_policy, "shadowed")
        self.output_scores = generation_config.output_scores and generation_config.return_dict_in_generate
        self.scores: list[torch.Tensor] = []
        self.host_stops = HostStops.from_criteria(stopping_criteria)
        self.host_ids: torch.Tensor | None = None  # [seq] the committed tokens, on the host (for lookup and stops)

    @torch.no_grad()
    def __call__(self, input_ids: torch.LongTensor, cache):
        if hasattr(cache, "activate_past_recording"):
            cache.activate_past_recording()
        prompt_len = input_ids.shape[1]
        self.host_ids = input_ids[0].cpu()
        stopped = False
        while not stopped:
            round_ = self.draft_tree(input_ids, cache)
            outputs = self.verify(round_, cache)
            target_scores = self.target_scores(input_ids, outputs.logits[0].float(), round_)
            path, next_token = self.accept(round_, target_scores)
            compact_cache(cache, len(round_.tree), path)
            self.learn(round_, path, next_token)
            if self.conditioned:
                self.record_features(round_, outputs, path)
            input_ids, stopped = self.commit(input_ids, round_, path, next_token, target_scores)
        self.stats.new_tokens += input_ids.shape[1] - prompt_len
        if self.streamer is not None:
            self.streamer.end()
        if self.generation_config.return_dict_in_generate:
            return GenerateDecoderOnlyOutput(sequences=input_ids, **{CACHE_KWARG: cache},
                                             scores=tuple(self.scores) if self.output_scores else None)
        return input_ids

    def draft_tree(self, input_ids: torch.LongTensor, cache) -> TreeRound:
        """The round's tree: K drafts from one drafter forward and the lookup drafts; greedy keeps the likeliest nodes."""
        started = time.perf_counter()
        past = cache.get_seq_length()
        room = self.generation_config.max_length - input_ids.shape[1] - 1
        if self.shadow_probes:
            num_tokens = self.length_policy.next_length(allow_skip=True, allow_shadow=True)
            if self.length_policy.shadow_probe and room > 0:
                started += self.shadow_probe(input_ids)
        else:
            num_tokens = self.length_policy.next_length(allow_skip=True)
        num_tokens = min(num_tokens, room)  # 0: the drafter does not pay
        if num_tokens and self.conditioned and not self.drafter_cache.verifier_features.usable_length(input_ids[0]):
            num_tokens = 0  # the verifier reads the prompt first
        lookups = prompt_lookup(self.host_ids, min(self.lookup_tokens, room), self.num_lookup_drafts) \
            if self.lookup_tokens and room > 0 else []
        kept = lookups
        if self.do_sample:
            num_tokens, kept = self._plan_sampling(num_tokens, lookups)
        drafts, draft_scores = [], None
        if num_tokens > 0:
            draft, draft_scores = self.call_drafter(input_ids, num_tokens, do_sample=self.do_sample)
            if self.do_sample:
                drafts = draft.cpu() if self.num_drafts == 1 else sample_drafts(draft_scores, self.num_drafts)
        if not self.do_sample and (lookups or draft_scores is not None):  # keep the nodes likeliest accepted
            kept, drafts = self._prune(lookups, draft_scores)
            if self.length_policy.probing and draft_scores is not None and not any(drafts):
                drafts = [[int(draft_scores[0].argmax())]]  # a probe's token is verified: it measures acceptance
        tree = DraftTree.from_drafts(drafts, fixed=kept)
        return TreeRound(input_ids[:, past:], past, lookups, drafts, draft_scores, tree,
                         host_to_device(tree.tokens, input_ids.device), started)

    def shadow_probe(self, input_ids: torch.LongTensor) -> float:
        """A greedy probe that verifies nothing, where the drafter's call costs less than a verified probe loses: the
        K likeliest first tokens, which `learn` compares with the token committed next. Returns its seconds, which
        the round's measured cost leaves out (the round is a plain step)."""
        started = device_clock(self.drafter.device)
        if self.conditioned and not self.drafter_cache.verifier_features.usable_length(input_ids[0]):
            return 0.0
        _, draft_scores = self.call_drafter(input_ids, 1)
        self.stats.shadow_probes += 1
        self.length_policy.shadowed([row[0] for row in self.candidates([], draft_scores)[0]])
        return device_clock(self.drafter.device) - started

    def call_drafter(self, input_ids: torch.LongTensor, num_tokens: int, do_sample: bool = False):
        """(draft, its scores on the verifier's device): one draft in the drafter's own steps (K = 1), or K drafts'
        marginals from one forward; counted in `stats.drafter_forwards`."""
        single = self.num_drafts == 1
        draft, draft_scores = self.drafter.draft(input_ids.to(self.drafter.device), self.drafter_cache, num_tokens,
                                                 self.logits_processor, do_sample=do_sample and single,
                                                 num_steps=None if single else 1)
        self.stats.drafter_forwards += min(num_tokens, self.drafter.config.num_denoising_steps) if single else 1
        return draft, draft_scores.to(input_ids.device)

    def _tree_budget(self):
        """(round costs, node cap): a tree sized by measured cost up to `DEFAULT_MAX_TREE_NODES`, or (None,
        max_tree_nodes) when the caller fixed the size; a single draft of fixed length is verified whole."""
        if self.max_tree_nodes:
            return None, self.max_tree_nodes
        if self.num_drafts == 1 and not self.lookup_tokens and self.length_policy.fixed is not None:
            return None, self.length_policy.fixed
        return self.round_costs, DEFAULT_MAX_TREE_NODES

    def _plan_sampling(self, num_tokens: int, lookups: list[list[int]]) -> tuple[int, list[list[int]]]:
        """Sampling: the drafter's draft length (at most `num_tokens`) and the lookup drafts cut to their depths
        (`sampling_plan`), from measured acceptance and round costs."""
        lookup_rates = [rates.rates()[:len(row)] for row, rates in zip(lookups, self.lookup_acceptance)]
        num_tokens, depths = sampling_plan(self.length_policy.acceptance.rates()[:num_tokens], self.num_drafts,
                                           lookup_rates, *self._tree_budget())
        return num_tokens, [row[:depth] for row, depth in zip(lookups, depths)]

    def _prune(self, lookups: list[list[int]], draft_scores: torch.Tensor | None) -> tuple[list, list]:
        """Greedy: the K likeliest drafts under the marginals and the lookup drafts, cut to the best tree nodes."""
        rows, path_scores = self.candidates(lookups, draft_scores)
        costs, max_nodes = self._tree_budget()
        rows = prune_drafts(rows, path_scores, max_nodes, costs=costs)
        return rows[:len(lookups)], rows[len(lookups):]

    def candidates(self, lookups: list[list[int]], draft_scores: torch.Tensor | None) -> tuple[list[list[int]], list]:
        """The candidate rows (the lookup drafts first, then the K likeliest drafts under the marginals) and, for
        each, the log-probability that each of its prefixes is accepted (each lookup draft's measured rates)."""
        rows = list(lookups)
        path_scores = [rates.rates()[:len(row)].log().cumsum(0).tolist()
                       for row, rates in zip(lookups, self.lookup_acceptance)]
        if draft_scores is not None:
            drafts, draft_path_scores = top_k_drafts(draft_scores.float().log_softmax(-1), self.num_drafts)
            rows += drafts
            path_scores += draft_path_scores
        return rows, path_scores

    def verify(self, round_: TreeRound, cache):
        """One verifier forward over the committed tokens and every tree node (tree attention, a position per node;
        a chain as plain decoding verifies tokens, under the model's own causal mask)."""
        committed, tree = round_.committed, round_.tree
        kwargs = dict(use_cache=True, logits_to_keep=1 + len(tree))
        if self.conditioned:
            kwargs["output_hidden_states"] = self.drafter.verifier_hidden_states
        input_ids = torch.cat([committed, round_.tokens[None]], dim=1)
        if tree.is_chain:
            return self.verifier(input_ids=input_ids, **{CACHE_KWARG: cache}, **kwargs)
        return tree_forward(self.verifier, cache, input_ids, committed.shape[1], tree, **kwargs)

    def target_scores(self, input_ids: torch.LongTensor, logits: torch.Tensor, round_: TreeRound):
        """The verifier's processed logits: row 0 at the last committed token, row 1 + n at node n, each processed
        with its own context (the committed tokens and the node's path) when first read (`TargetScores`)."""
        if not len(self.logits_processor):
            return logits
        return TargetScores(logits, input_ids, round_.tree, round_.tokens, self.logits_processor)

    def accept(self, round_: TreeRound, target_scores) -> tuple[list[int], int]:
        """The accepted nodes and the next token: the argmax walk, or multi-candidate speculative sampling."""
        if not self.do_sample:
            return accept_greedy(round_.tree, target_scores)
        draft_probs = None if round_.draft_scores is None else round_.draft_scores.float().softmax(-1)
        return accept_sampling(round_.tree, target_scores, draft_probs)  # draft_probs None: a lookup-only tree

    def learn(self, round_: TreeRound, path: list[int], next_token: int):
        """Statistics, the drafter's and the lookup draft's acceptance, and the round's cost for `tree_budget`."""
        tree = round_.tree
        self.stats.record_round(tree.max_depth, len(path))
        if round_.draft_scores is not None:  # the drafter's positions that were verified (pruning may cut the deepest)
            num_drafted = max(map(len, round_.drafts), default=0)
            if num_drafted:
                accepted = next((d for d, n in enumerate(path) if n in tree.fixed_only), len(path))
                self.length_policy.update(num_drafted, accepted)
            else:  # pruned away: the drafter's call did not pay
                self.length_policy.decline()
        if round_.lookups:
            self.learn_lookup(round_.lookups, tree.tokens[path].tolist() + [next_token])
        if self.shadow_probes:
            self.length_policy.update_shadow(int(tree.tokens[path[0]]) if path else next_token)
        if round_.committed.shape[1] == 1:  # a round that read no prompt
            self.learn_costs(round_, device_clock(self.verifier.device) - round_.started)

    def learn_costs(self, round_: TreeRound, seconds: float):
        """The round's seconds: by nodes verified for `tree_budget` (the drafter's call left out: a tree is sized after
        it ran), and for the length policy where the round was its own (one draft, no lookup branch, not cut to
        nothing), so that it learns what its drafting rounds and plain steps cost beyond the profile's forwards."""
        drafted = round_.draft_scores is not None
        if self.num_drafts == 1 and not round_.lookups and (len(round_.tree) or not drafted):
            self.length_policy.costs.record(len(round_.tree), seconds)
        if drafted and self.cost_profile is not None:
            seconds -= float(self.cost_profile.drafter_seconds(torch.tensor([round_.draft_scores.shape[0]]))[0])
        self.round_costs.record(len(round_.tree), seconds)

    def learn_lookup(self, lookups: list[list[int]], committed: list[int]):
        """Each lookup draft's acceptance by depth, from the verifier's greedy tokens this round, `committed`: as far
        as they reach, they tell how far the whole proposed draft would have been accepted, however much of it the
        tree kept. Learning only from the kept part, a branch pruned away after a few misses never came back."""
        for proposed, rates in zip(lookups, self.lookup_acceptance):
            known = min(len(proposed), len(committed))
            agreed = 0
            while agreed < known and proposed[agreed] == committed[agreed]:
                agreed += 1
            rates.update(known, agreed)

    def record_features(self, round_: TreeRound, outputs, path: list[int]):
        """Keep the verifier's features of what it read: the committed tokens and the accepted path."""
        committed = round_.committed[0]
        features = self.drafter.select_features(outputs.hidden_states)[0]
        read_positions = torch.cat([torch.arange(len(committed)), len(committed) + torch.tensor(path, dtype=torch.long)])
        read_tokens = torch.cat([committed, round_.tokens[path]])
        self.drafter_cache.verifier_features.record(round_.past, read_tokens,
                                                    features[host_to_device(read_positions, features.device)])

    def commit(self, input_ids: torch.LongTensor, round_: TreeRound, path: list[int], next_token: int,
               target_scores) -> tuple[torch.LongTensor, bool]:
        """Append the accepted path and the next token, cut where a stopping criterion fires, stream them."""
        start = input_ids.shape[1]
        new_tokens = round_.tree.tokens[path].tolist() + [next_token]  # host data: the tree and the walk's result
        input_ids = torch.cat([input_ids, host_to_device(torch.tensor([new_tokens]), input_ids.device)], dim=1)
        stop = self.host_stops.stop_index(new_tokens, start) if self.host_stops is not None else \
            _stop_index(input_ids, start, self.stopping_criteria)
        if stop is not None:
            input_ids = input_ids[:, :stop]
        self.host_ids = torch.cat([self.host_ids, torch.tensor(new_tokens[: input_ids.shape[1] - start])])
        if self.output_scores:
            self.scores += [target_scores[row][None] for row in [0] + [1 + n for n in path]][: input_ids.shape[1] - start]
        if self.streamer is not None:
            self.streamer.put(self.host_ids[None, start:])
        return input_ids, stop is not None


def specdiff_generate(model, input_ids, logits_processor, stopping_criteria, generation_config, synced_gpus=False,
                      drafter=None, num_drafts: int = 1, draft_length: int | None = None, lookup_tokens: int = 0,
                      num_lookup_drafts: int = DEFAULT_NUM_LOOKUP_DRAFTS, max_tree_nodes: int | None = None,
                      token_streamer=None, specdiff_stats: SpecDiffStats | None = None, cost_profile=None,
                      **model_kwargs):
    """A `custom_generate` callable: `model.generate(**inputs, custom_generate=specdiff_generate, drafter=...)`.

    Args:
        drafter: a SpecDiff drafter for this verifier.
        num_drafts: K, the drafts verified together as a prefix tree (1: a single draft in the drafter's own
            denoising steps, verified as a chain).
        draft_length: a fixed draft length (<= block size); `None` adapts it to measured acceptance.
        lookup_tokens: if > 0, each round's tree also holds prompt-lookup drafts of up to this many tokens (what
            followed earlier matches of the context's last 1-3 tokens); runs the tree loop.
        num_lookup_drafts: how many lookup drafts (distinct continuations of the latest matches) a tree holds.
        max_tree_nodes: a tree verifies this many nodes per round, lookup branches included. Greedy keeps the
            prefixes most likely to be accepted, drafter nodes by the drafter's marginals, lookup nodes by each
            lookup draft's measured acceptance at each depth; sampling sizes its tree before drawing
            (`sampling_plan`): the length of the K draws and the depth kept of each lookup draft, by measured
            acceptance. `None`: each round picks how many (0 to `DEFAULT_MAX_TREE_NODES`) from those
            probabilities and the measured cost of a round on this machine (`tree_budget`, `sampling_plan`).
        token_streamer: a streamer (`put`/`end`), since transformers does not forward `streamer` to custom loops;
            like `generate`, it gets the prompt first, then the new tokens.
        specdiff_stats: a `SpecDiffStats` to fill with what the call did (rounds, tau, acceptance by position).
        cost_profile: what rounds cost on this machine (`drafter.cost_profile(model)`, measured once per machine and
            models and cached; the default), which every draft-length and tree-size decision starts from.

    transformers drops `tokenizer` before calling a custom loop, so `stop_strings` need `generate(...)` below, or
    `stopping_criteria=[StopStringCriteria(tokenizer, stop_strings)]`.
    """
    if drafter is None:
        raise ValueError("specdiff_generate needs a drafter: model.generate(..., drafter=drafter)")
    if input_ids.shape[0] != 1:
        raise ValueError(f"SpecDiff decoding runs one prompt at a time (got batch size {input_ids.shape[0]}).")
    if input_ids.shape[1] == 0:
        raise ValueError("The prompt is empty: pass at least one token (for example the BOS token).")
    attention_mask = model_kwargs.get("attention_mask")
    if attention_mask is not None and not bool(attention_mask.all()):
        raise ValueError("SpecDiff decoding does not take padded inputs: pass one unpadded prompt.")
    if num_drafts < 1:
        raise ValueError(f"num_drafts must be >= 1, got {num_drafts}")
    if lookup_tokens < 0:
        raise ValueError(f"lookup_tokens must be >= 0, got {lookup_tokens}")
    if num_lookup_drafts < 1:
        raise ValueError(f"num_lookup_drafts must be >= 1, got {num_lookup_drafts}")
    if max_tree_nodes is not None and max_tree_nodes < 1:
        raise ValueError(f"max_tree_nodes must be >= 1, got {max_tree_nodes}")
    longest = getattr(drafter.config, "max_draft_tokens", drafter.config.block_size)
    if draft_length is not None and not 1 <= draft_length <= longest:
        raise ValueError(f"draft_length must be between 1 and the drafter's longest draft ({longest}), "
                         f"got {draft_length}")
    drafter.set_verifier(model)  # checks the pair; a dflash-layout drafter drafts with the verifier's weights
    stats = specdiff_stats if specdiff_stats is not None else SpecDiffStats()
    if num_drafts > 1 or lookup_tokens:
        _check_tree_support(model)  # before the profile's forwards, which would fail less clearly
    if cost_profile is None:
        cost_profile = drafter.cost_profile(model)
    if token_streamer is not None:  # as in transformers' generate: the prompt first (TextStreamer's skip_prompt)
        token_streamer.put(input_ids.cpu())
    tree_decoding = TreeDecoding(model, drafter, generation_config, logits_processor, stopping_criteria,
                                 num_drafts=num_drafts, draft_length=draft_length, lookup_tokens=lookup_tokens,
                                 num_lookup_drafts=num_lookup_drafts, max_tree_nodes=max_tree_nodes,
                                 streamer=token_streamer, stats=stats, cost_profile=cost_profile)
    # a drafter's remote code from before 2026-12-07 gives profiles without a kernel choice
    kernels = cost_profile.verifier_kernels(model) if hasattr(cost_profile, "verifier_kernels") else nullcontext()
    with kernels:  # each verifier forward with the kernels the profile found faster for its size (if any)
        return tree_decoding(input_ids, model_kwargs[CACHE_KWARG])


def generate(model, drafter=None, *args, num_drafts: int = 1, draft_length: int | None = None, lookup_tokens: int = 0,
             num_lookup_drafts: int = DEFAULT_NUM_LOOKUP_DRAFTS, max_tree_nodes: int | None = None, streamer=None,
             stats: SpecDiffStats | None = None, cost_profile=None, **kwargs):
    """`model.generate(*args, **kwargs)` with SpecDiff drafting: the short form, and the Hub `custom_generate` entry.

    Takes every `generate` argument, plus `drafter`, `num_drafts` (K), `draft_length` (None: adaptive),
    `lookup_tokens` (prompt-lookup branches in the tree; 0: none), `num_lookup_drafts` (how many), `max_tree_nodes`
    (tree size, lookup branches included; None: sized each round by measured cost, at most
    `DEFAULT_MAX_TREE_NODES`), `streamer`, `stats` (a `SpecDiffStats` to fill) and `cost_profile` (default: this
    machine's, measured once and cached).
    """
    if drafter is None:
        raise ValueError("Pass the drafter: generate(model, drafter, **inputs) or model.generate(..., drafter=drafter)")
    kwargs.pop("custom_generate", None)
    kwargs.pop("trust_remote_code", None)
    stop_strings, tokenizer = kwargs.pop("stop_strings", None), kwargs.pop("tokenizer", None)
    if stop_strings:  # transformers would drop the tokenizer on the way to a custom loop: build the criterion here
        if tokenizer is None:
            raise ValueError("stop_strings need the verifier's tokenizer: pass tokenizer=...")
        criteria = StoppingCriteriaList(kwargs.pop("stopping_criteria", None) or [])
        criteria.append(StopStringCriteria(tokenizer, [stop_strings] if isinstance(stop_strings, str) else stop_strings))
        kwargs["stopping_criteria"] = criteria
    return GenerationMixin.generate(model, *args, custom_generate=specdiff_generate, drafter=drafter,
                                    num_drafts=num_drafts, draft_length=draft_length, lookup_tokens=lookup_tokens,
                                    num_lookup_drafts=num_lookup_drafts, max_tree_nodes=max_tree_nodes,
                                    token_streamer=streamer, specdiff_stats=stats, cost_profile=cost_profile,
                                    **kwargs)


__all__ = ["SpecDiffStats", "DraftTree", "specdiff_generate", "generate"]
