"""The verifier's features over a whole distillation data set, computed once and kept in the data folder.

A conditioned drafter trains on the verifier's hidden states at its `verifier_layer_ids`. Teacher-forcing the verifier
in every training step costs more than the drafter's own step; computed once per row, with the row's whole prompt and
response as context (as at drafting time), they serve every step, epoch and run. Stored in bf16.
"""

import os
from pathlib import Path

import torch
from tqdm.auto import tqdm


def cache_path(data, layer_ids: list[int]) -> Path:
    return Path(data) / f"features-layers-{'-'.join(map(str, layer_ids))}.pt"


@torch.no_grad()
def compute_features(verifier, drafter, rows: list[dict], max_batch_tokens: int = 8192,
                     progress: bool = True) -> list[torch.Tensor]:
    """Per row, the features [len(prompt + response), F] the conditioned `drafter` reads, in bf16 on the CPU."""
    sequences = [row["prompt_ids"] + row["response_ids"] for row in rows]
    order = sorted(range(len(rows)), key=lambda i: len(sequences[i]))
    features: list[torch.Tensor | None] = [None] * len(rows)
    bar = tqdm(total=len(rows), desc="verifier features", disable=not progress)
    start = 0
    while start < len(order):
        end = start + 1
        while end < len(order) and (end - start + 1) * len(sequences[order[end]]) <= max_batch_tokens:
            end += 1
        batch = order[start:end]
        longest = len(sequences[batch[-1]])
        ids = torch.zeros(len(batch), longest, dtype=torch.long)
        valid = torch.zeros(len(batch), longest, dtype=torch.long)
        for b, i in enumerate(batch):
            ids[b, : len(sequences[i])] = torch.tensor(sequences[i])
            valid[b, : len(sequences[i])] = 1
        out = verifier(input_ids=ids.to(verifier.device), attention_mask=valid.to(verifier.device),
                       output_hidden_states=drafter.verifier_hidden_states, logits_to_keep=1)
        selected = drafter.select_features(out.hidden_states).to("cpu", torch.bfloat16)
        for b, i in enumerate(batch):
            features[i] = selected[b, : len(sequences[i])].clone()
        bar.update(len(batch))
        start = end
    bar.close()
    return features


def attach_features(data, verifier, drafter, rows: list[dict], progress: bool = True) -> list[dict]:
    """Give every row its verifier features (`row["features"]`), from the data folder's cache for these layers, or
    computed and cached there (written whole, then renamed: a killed run leaves no partial cache)."""
    path = cache_path(data, drafter.config.verifier_layer_ids)
    features = torch.load(path, weights_only=True) if path.exists() else None
    if features is None or len(features) != len(rows) or any(
            f.shape[0] != len(r["prompt_ids"]) + len(r["response_ids"]) for f, r in zip(features, rows)):
        features = compute_features(verifier, drafter, rows, progress=progress)
        staging = path.with_suffix(".tmp")
        torch.save(features, staging)
        os.replace(staging, path)
    for row, row_features in zip(rows, features):
        row["features"] = row_features
    return rows
