"""The verifier's features over a whole distillation data set, computed once and kept in the data folder.

A conditioned drafter trains on the verifier's hidden states at its `verifier_layer_ids`. Teacher-forcing the verifier
in every training step costs more than the drafter's own step; computed once per row, with the row's whole prompt and
response as context (as at drafting time), they serve every step, epoch and run. Stored in bf16. The same forward
can give the verifier's k likeliest next tokens at every position, so a KL term needs no verifier at training time.

A cache is a folder of shards of `SHARD_ROWS` rows, each written whole as soon as it is computed: a run that is
killed keeps its finished shards, and a data folder that gains rows recomputes only its last shard. `distill-data
--verifier-layers` writes the same shards while it generates, from the hidden states the generation reads anyway.
Shards are memory-mapped when read, so millions of tokens of features (7 KB a token for SmolLM2's three layers)
need no RAM of their own.
"""

import os
from pathlib import Path

import torch
from tqdm.auto import tqdm


SHARD_ROWS = 512


def cache_path(data, layer_ids: list[int]) -> Path:
    """The folder of the features of the verifier's layers `layer_ids` in data folder `data`."""
    return Path(data) / f"features-layers-{'-'.join(map(str, layer_ids))}"


def top_k_cache_path(data, top_k: int) -> Path:
    """The folder of the verifier's `top_k` likeliest next tokens in data folder `data`."""
    return Path(data) / f"verifier-top-{top_k}"


def shard_name(first_row: int) -> str:
    """The file of the shard that holds row `first_row`."""
    return f"shard-{first_row // SHARD_ROWS:05d}.pt"


class FeatureShardWriter:
    """Keeps features of rows as a data set is generated (`make_distill_data`), in the shards `attach_features`
    reads: a shard is written once all its rows have theirs. Rows whose shard cannot be completed (rows before them
    were made by a run that was killed before it wrote them) are left to `attach_features` to compute."""

    def __init__(self, data, layer_ids: list[int], total_rows: int):
        self.folder, self.total_rows, self.pending = cache_path(data, layer_ids), total_rows, {}

    def add(self, row: int, features: torch.Tensor):
        self.pending[row] = features
        first = row - row % SHARD_ROWS
        rows = range(first, min(first + SHARD_ROWS, self.total_rows))
        if all(i in self.pending for i in rows):
            _save(self.folder / shard_name(first), [self.pending.pop(i) for i in rows])


def _batches(sequences: list[list[int]], max_batch_tokens: int):
    """Indices of `sequences` in batches of similar lengths, each padded to at most `max_batch_tokens`."""
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))
    start = 0
    while start < len(order):
        end = start + 1
        while end < len(order) and (end - start + 1) * len(sequences[order[end]]) <= max_batch_tokens:
            end += 1
        yield order[start:end]
        start = end


def _shift_right(x: torch.Tensor) -> torch.Tensor:
    """[B, L, ...] -> the same one position later (position t gets t - 1's; position 0 zeros), on the CPU."""
    return torch.cat([torch.zeros_like(x[:, :1]), x[:, :-1]], dim=1).cpu()


@torch.no_grad()
def compute_features(verifier, drafter, rows: list[dict], top_k: int = 0, max_batch_tokens: int = 8192,
                     bar=None) -> tuple[list[torch.Tensor], list[tuple[torch.Tensor, torch.Tensor]] | None]:
    """Per row, the features [len(prompt + response), F] the conditioned `drafter` reads, in bf16 on the CPU; with
    `top_k`, also the verifier's k likeliest next tokens: at position t, (ids, log-probs) [L, k] of its prediction
    for token t (from position t - 1; row 0 predicts nothing and holds id 0)."""
    sequences = [row["prompt_ids"] + row["response_ids"] for row in rows]
    features: list = [None] * len(rows)
    top: list | None = [None] * len(rows) if top_k else None
    for batch in _batches(sequences, max_batch_tokens // 4 if top_k else max_batch_tokens):
        longest = len(sequences[batch[-1]])
        ids = torch.zeros(len(batch), longest, dtype=torch.long)
        valid = torch.zeros(len(batch), longest, dtype=torch.long)
        for b, i in enumerate(batch):
            ids[b, : len(sequences[i])] = torch.tensor(sequences[i])
            valid[b, : len(sequences[i])] = 1
        out = verifier(input_ids=ids.to(verifier.device), attention_mask=valid.to(verifier.device),
                       output_hidden_states=drafter.verifier_hidden_states, logits_to_keep=0 if top_k else 1)
        selected = drafter.select_features(out.hidden_states).to("cpu", torch.bfloat16)
        if top_k:
            log_probs, top_ids = out.logits.float().log_softmax(-1).topk(top_k, dim=-1)
            top_ids, log_probs = _shift_right(top_ids.int()), _shift_right(log_probs.half())
        for b, i in enumerate(batch):
            features[i] = selected[b, : len(sequences[i])].clone()
            if top_k:
                top[i] = (top_ids[b, : len(sequences[i])].clone(), log_probs[b, : len(sequences[i])].clone())
        if bar is not None:
            bar.update(len(batch))
    return features, top


def _load_matching(path: Path, rows: list[dict]):
    """The cached per-row list in shard file `path` (memory-mapped) if it exists and matches the rows' lengths,
    else None."""
    cached = torch.load(path, weights_only=True, mmap=True) if path.exists() else None
    if cached is None or len(cached) != len(rows) or any(
            (c[0] if isinstance(c, (tuple, list)) else c).shape[0] != len(r["prompt_ids"]) + len(r["response_ids"])
            for c, r in zip(cached, rows)):
        return None
    return cached


def _save(path: Path, value):
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_suffix(".tmp")  # written whole, then renamed: a killed run leaves no partial shard
    torch.save(value, staging)
    os.replace(staging, path)


def attach_features(data, verifier, drafter, rows: list[dict], top_k: int = 0, progress: bool = True) -> list[dict]:
    """Give every row its verifier features (`row["features"]`) and, with `top_k`, the verifier's k likeliest next
    tokens (`row["verifier_top_k"]`, see `compute_features`): from the data folder's caches, or computed and
    cached there, shard by shard. `verifier` may be a function that returns it, called at the first shard to compute
    (never when all are cached)."""
    features_dir, top_dir = cache_path(data, drafter.config.verifier_layer_ids), top_k_cache_path(data, top_k)
    bar = tqdm(total=len(rows), desc="verifier features", disable=not progress)
    for start in range(0, len(rows), SHARD_ROWS):
        shard, name = rows[start : start + SHARD_ROWS], shard_name(start)
        features = _load_matching(features_dir / name, shard)
        top = _load_matching(top_dir / name, shard) if top_k else None
        if features is None or (top_k and top is None):
            if verifier is None:
                missing = "features" if features is None else f"verifier top-{top_k}"
                raise ValueError(f"{data} has no {missing} cached for these rows: computing them needs the verifier")
            if not isinstance(verifier, torch.nn.Module):
                verifier = verifier()
            computed, computed_top = compute_features(verifier, drafter, shard, top_k, bar=bar)
            if features is None:  # write only what was missing (the features are the large part)
                _save(features_dir / name, computed)
            if top_k and top is None:
                _save(top_dir / name, computed_top)
            # read back memory-mapped, so the computed copies leave RAM
            features = _load_matching(features_dir / name, shard)
            top = _load_matching(top_dir / name, shard) if top_k else None
        else:
            bar.update(len(shard))
        for row, row_features, row_top in zip(shard, features, top or [None] * len(shard)):
            row["features"] = row_features
            if top_k:
                row["verifier_top_k"] = tuple(row_top)
    bar.close()
    return rows
