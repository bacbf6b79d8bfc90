"""Training a SpecDiff drafter for a verifier: initialisation, the training step, checkpoints and held-out metrics.

    hf-specdiff train --verifier PATH --data DATA/ --objective streak --out DRAFTER/
    accelerate launch -m hf_specdiff.training ...                       # same, on several GPUs or nodes

Every block of a sequence is trained in one forward (see `block_diffusion`). A step's batch and noise come from
generators seeded by (seed, step, process), so a resumed run sees exactly the data an uninterrupted run would:
with the model, optimizer and scheduler restored from the last checkpoint, it ends with the same weights.
"""

import copy
import functools
import json
import math
import os
import platform
import shutil
import time
import warnings
from contextlib import nullcontext
from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import NamedTuple

import torch
from tqdm.auto import tqdm

from .block_diffusion import NOISE_MODES, block_logits, make_block_diffusion_batch
from ..compat import dflash_sizes, drafter_config_for
from .data import load_distill_data, verifier_identity
from .feature_cache import attach_features
from ..modeling_specdiff import SpecDiffDrafter
from .objectives import (KL_WEIGHTINGS, OBJECTIVES, ce_streak_loss, kl_position_weights, kl_to_verifier, mdlm_loss,
                         streak_loss, target_log_probs, top_k_kl_to_verifier)


@dataclass
class TrainConfig:
    """Everything a training run depends on (saved with its checkpoints and the final drafter)."""

    verifier: str = field(metadata={"help": "verifier folder, or a known name (smollm2-135m-instruct)"})
    data: str = field(metadata={"help": "distillation data folder made by `hf-specdiff distill-data`, or several "
                                        "separated by commas (e.g. greedy and sampled responses to one prompt set)"})
    out: str = field(metadata={"help": "output folder: the drafter, checkpoint/ and log.jsonl"})
    kind: str = field(default="diffusion", metadata={"help": "diffusion (a SpecDiff drafter), or ar: an "
                                                             "autoregressive Llama drafter of the same sizes, the "
                                                             "classic assisted-generation baseline"})
    objective: str = field(default="ce-streak", metadata={"help": f"one of {OBJECTIVES}; plain streak vanishes from "
                                                                  "scratch (its gradient scales with prod q): use it "
                                                                  "to fine-tune a trained drafter"})
    verifier_layers: str = field(default="", metadata={"help": "make a conditioned drafter that reads these verifier "
                                                                 "layers: 'auto' (3 spread over depth) or a list "
                                                                 "like '1,14,28'; empty: a standalone drafter"})
    layout: str = field(default="specdiff", metadata={"help": "specdiff (own embeddings and head, sizes below), or "
                                                              "dflash: the verifier's width, heads and MLP (only "
                                                              "num_hidden_layers is taken from here), its embedding "
                                                              "table and head; needs verifier_layers"})
    mask_token_id: int = field(default=-1, metadata={"help": "dflash: the verifier token that marks masked "
                                                             "positions; -1: the rarest token of the data"})
    feature_cache: bool = field(default=False, metadata={"help": "conditioned drafters: the verifier's features of "
                                                                 "every row computed once (kept in the data folder, "
                                                                 "whole rows as context) instead of per window "
                                                                 "every step; cheaper, but trained worse at equal "
                                                                 "steps on the tests' toy verifier"})
    mdlm_weight: float = field(default=0.0, metadata={"help": "weight of an added mdlm term (random masking)"})
    kl_weight: float = field(default=0.0, metadata={"help": "weight of KL(verifier || drafter) on masked positions"})
    kl_weighting: str = field(default="uniform", metadata={"help": f"how the KL term weighs block positions: "
                                                                   f"{KL_WEIGHTINGS} (streak: by the probability the "
                                                                   "drafter's streak reaches the position)"})
    kl_top_k: int = field(default=64, metadata={"help": "with feature_cache: the KL term uses the verifier's k "
                                                        "likeliest next tokens, cached with the features (no verifier "
                                                        "forward per step); 0: its whole distribution, every step"})
    init: str = field(default="from-verifier", metadata={"help": "random, from-verifier (embeddings and head), or a "
                                                               "drafter folder to train further (its sizes must "
                                                               "match these settings)"})
    init_layers: int = field(default=0, metadata={"help": "copy this many first verifier layers (equal sizes only)"})
    hidden_size: int = 256
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    intermediate_size: int = 768
    draft_vocab_size: int = field(default=0, metadata={"help": "reduced draft vocabulary (most frequent tokens of "
                                                               "the data); 0 = the whole vocabulary"})
    block_size: int = 16
    num_denoising_steps: int = 1
    noise: str = field(default="full", metadata={"help": f"block noising: {NOISE_MODES} (full for T=1)"})
    seq_len: int = field(default=256, metadata={"help": "tokens per training window"})
    batch_size: int = field(default=8, metadata={"help": "windows per optimizer step (per micro-batch with "
                                                         "grad_accum), over all processes together"})
    grad_accum: int = 1
    lr: float = 1e-3
    warmup_steps: int = 50
    max_steps: int = 1000
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    precision: str = field(default="fp32", metadata={"help": "fp32 or bf16 (mixed precision)"})
    save_every: int = 200
    eval_every: int = 100
    log_every: int = 10
    eval_fraction: float = field(default=0.05, metadata={"help": "share of prompts held out for evaluation"})
    max_train_rows: int = field(default=0, metadata={"help": "train on N training rows only, a fixed random draw "
                                                             "(a smaller N's rows are among a larger N's; the "
                                                             "held-out rows stay the same: learning curves); 0: all"})
    seed: int = 0


# ----------------------------------------------------------------------------------------------------------------
# Initialisation


def frequent_tokens(rows: list[dict], size: int, always: list[int]) -> list[int]:
    """The `size` most frequent response tokens of `rows`, plus `always` (e.g. EOS), sorted."""
    counts = torch.zeros(max(max(r["response_ids"] + r["prompt_ids"] + always) for r in rows) + 1)
    for row in rows:
        counts += torch.bincount(torch.tensor(row["response_ids"] + row["prompt_ids"], dtype=torch.long),
                                 minlength=counts.shape[0])
    counts[always] = float("inf")
    return sorted(counts.topk(min(size, int((counts > 0).sum()))).indices.tolist())


def rarest_token(rows: list[dict], vocab_size: int) -> int:
    """The token of the vocabulary least seen in `rows` (the highest id among ties): a dflash drafter's mask."""
    counts = torch.zeros(vocab_size)
    for row in rows:
        counts += torch.bincount(torch.tensor(row["response_ids"] + row["prompt_ids"], dtype=torch.long),
                                 minlength=vocab_size)[:vocab_size]
    return int(vocab_size - 1 - counts.flip(0).argmin())


@torch.no_grad()
def init_from_verifier(drafter, verifier, num_layers: int = 0):
    """Drafter embeddings and head from the verifier's (projected onto the top principal directions of its
    embedding when the drafter is narrower), and optionally its first layers. A dflash-layout drafter borrows the
    verifier's embeddings and head, so only layers are copied (QK-norm weights stay ones where the verifier has none)."""
    if not getattr(drafter.config, "uses_verifier_weights", False):
        _init_embeddings_and_head(drafter, verifier)
    if num_layers:
        _copy_verifier_layers(drafter, verifier, num_layers)


def _init_embeddings_and_head(drafter, verifier):
    embed = verifier.get_input_embeddings().weight.float()
    head = verifier.get_output_embeddings().weight.float()
    hidden = drafter.config.hidden_size
    if hidden == embed.shape[1]:
        projection = torch.eye(hidden)
    elif hidden < embed.shape[1]:
        projection = torch.linalg.svd(embed - embed.mean(0), full_matrices=False).Vh[:hidden].T
    else:
        raise ValueError(f"hidden_size {hidden} is wider than the verifier's {embed.shape[1]}: use init=random")
    drafter_embed = embed @ projection
    vocab = embed.shape[0]
    drafter.get_input_embeddings().weight[:vocab] = drafter_embed
    drafter.get_input_embeddings().weight[vocab:] = drafter_embed.mean(0)  # the mask token, if any
    ids = drafter.draft_vocab_ids(head.device) if hasattr(drafter, "draft_vocab_ids") else None
    drafter.get_output_embeddings().weight.copy_((head if ids is None else head[ids]) @ projection)


def _copy_verifier_layers(drafter, verifier, num_layers: int):
    theirs = verifier.state_dict()
    copied = 0
    for name, tensor in drafter.state_dict().items():
        if not name.startswith("model.layers.") or int(name.split(".")[2]) >= num_layers:
            continue
        if name.endswith(("q_norm.weight", "k_norm.weight")) and name not in theirs:
            continue  # QK-norm the verifier lacks: identity (ones) at first
        if name not in theirs or theirs[name].shape != tensor.shape:
            raise ValueError(f"cannot copy verifier layer weight {name}: the drafter's shapes differ "
                             "(init_layers needs the verifier's sizes)")
        tensor.copy_(theirs[name])
        copied += 1
    if not copied:
        raise ValueError("init_layers found no layer weights to copy")


def build_drafter(config: TrainConfig, verifier, rows: list[dict]):
    """A fresh drafter for `verifier` as `config` describes, or the one in folder `config.init` to train further."""
    torch.manual_seed(config.seed)
    if init_folder(config) is not None:
        return load_drafter_to_train(config, verifier)
    if config.kind == "ar":
        drafter = _ar_drafter(config, verifier)
        if config.init == "from-verifier":
            init_from_verifier(drafter, verifier, config.init_layers)
        return drafter
    eos = verifier.generation_config.eos_token_id
    eos = eos if isinstance(eos, list) else [eos] if eos is not None else []
    draft_ids = frequent_tokens(rows, config.draft_vocab_size, eos) if config.draft_vocab_size else None
    window = config.seq_len + config.block_size + 1  # the positions a training window covers
    drafter_config = drafter_config_for(
        verifier, num_hidden_layers=config.num_hidden_layers, num_denoising_steps=config.num_denoising_steps,
        draft_token_ids=draft_ids, max_position_embeddings=max(2048, window), context_window=window,
        verifier_name_or_path=config.verifier, conditioned=bool(config.verifier_layers),
        **({"verifier_layer_ids": [int(i) for i in config.verifier_layers.split(",")]}
           if config.verifier_layers not in ("", "auto") else {}),
        **_layout_settings(config, verifier, rows),
    )
    drafter = SpecDiffDrafter(drafter_config).set_verifier(verifier)
    if config.init == "from-verifier":
        init_from_verifier(drafter, verifier, config.init_layers)
    return drafter


def _layout_settings(config: TrainConfig, verifier, rows: list[dict]) -> dict:
    """Sizes, block and mask of the drafter config: the dflash layout takes the verifier's sizes, counts the anchor
    in its block and masks with a verifier token."""
    if config.layout == "dflash":
        vocab = verifier.config.get_text_config().vocab_size
        mask = config.mask_token_id if config.mask_token_id >= 0 else rarest_token(rows, vocab)
        return dict(layout="dflash", mask_token_id=mask, block_size=config.block_size + 1, **dflash_sizes(verifier))
    return dict(hidden_size=config.hidden_size, num_attention_heads=config.num_attention_heads,
                num_key_value_heads=config.num_key_value_heads, intermediate_size=config.intermediate_size,
                block_size=config.block_size)


def init_folder(config: TrainConfig) -> Path | None:
    """The drafter folder a run trains further, or None when it starts a fresh drafter."""
    return None if config.init in ("random", "from-verifier") else Path(config.init)


def load_drafter_to_train(config: TrainConfig, verifier):
    """The drafter saved in folder `config.init`, after checking that it is the one `config` describes: same
    verifier vocabulary, kind, sizes, block size, draft vocabulary size and conditioning."""
    from transformers import AutoModelForCausalLM

    path = init_folder(config)
    drafter = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    theirs = drafter.config
    kind = "diffusion" if isinstance(drafter, SpecDiffDrafter) else "ar"
    sizes = ("num_hidden_layers",) if config.layout == "dflash" else (
        "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "intermediate_size")
    want = {"kind": config.kind, "vocab_size": verifier.config.get_text_config().vocab_size,
            **{name: getattr(config, name) for name in sizes}}
    have = {"kind": kind, **{name: getattr(theirs, name, None) for name in list(want)[1:]}}
    if kind == "diffusion":
        want.update(layout=config.layout, max_draft_tokens=config.block_size,
                    draft_vocab_size=config.draft_vocab_size, conditioned=bool(config.verifier_layers))
        have.update(layout=theirs.layout, max_draft_tokens=theirs.max_draft_tokens,
                    draft_vocab_size=len(theirs.draft_token_ids or []),
                    conditioned=theirs.verifier_layer_ids is not None)
    differ = [f"{name} {have[name]} there, {want[name]} here" for name in want if have[name] != want[name]]
    if differ:
        raise ValueError(f"the drafter in {path} differs from these settings ({'; '.join(differ)}): set them to "
                         "the drafter's")
    return drafter.set_verifier(verifier)


def _ar_drafter(config: TrainConfig, verifier):
    from transformers import LlamaConfig, LlamaForCausalLM

    text = verifier.config.get_text_config()
    ar_config = LlamaConfig(
        vocab_size=text.vocab_size, hidden_size=config.hidden_size, intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_hidden_layers, num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads, max_position_embeddings=max(2048, config.seq_len),
        tie_word_embeddings=False, bos_token_id=text.bos_token_id, eos_token_id=text.eos_token_id,
        pad_token_id=text.pad_token_id,
    )
    drafter = LlamaForCausalLM(ar_config)
    drafter.generation_config.num_assistant_tokens = config.block_size
    return drafter


# ----------------------------------------------------------------------------------------------------------------
# Data


class DataSource(NamedTuple):
    """One distillation data folder of a training run."""

    folder: str
    meta: dict
    rows: list[dict]


def load_training_data(data: str, verifier, verifier_name: str) -> list[DataSource]:
    """The distillation data folders in `data` (one, or several separated by commas), each checked to be made by
    `verifier`."""
    identity = verifier_identity(verifier)
    folders = [folder.strip() for folder in data.split(",") if folder.strip()]
    sources = [DataSource(folder, *load_distill_data(folder)) for folder in folders]
    if not sources:
        raise ValueError("no data folder given")
    for source in sources:
        if source.meta["verifier"]["fingerprint"] != identity["fingerprint"]:
            raise ValueError(f"{source.folder} was made by another verifier ({source.meta['verifier']}) than "
                             f"{verifier_name} ({identity}): make data with this verifier, or train for that one")
    return sources


def split_rows(rows: list[dict], eval_fraction: float) -> tuple[list[dict], list[dict]]:
    """(train, held-out) by prompt: a prompt's samples all land on the same side."""
    held = {i for i in {r["prompt_index"] for r in rows} if (i * 2654435761) % 1000 < eval_fraction * 1000}
    return [r for r in rows if r["prompt_index"] not in held], [r for r in rows if r["prompt_index"] in held]


class Windows(NamedTuple):
    """A batch of training windows: token ids [B, L], valid [B, L], and what the rows carry for those tokens."""

    ids: torch.Tensor
    valid: torch.Tensor
    features: torch.Tensor | None = None  # [B, L, F] the verifier's cached features (`feature_cache`)
    verifier_top_k: tuple[torch.Tensor, torch.Tensor] | None = None  # ids, log-probs [B, L, k] (`kl_top_k`)

    def to(self, device) -> "Windows":
        top = None if self.verifier_top_k is None else tuple(t.to(device) for t in self.verifier_top_k)
        return Windows(self.ids.to(device), self.valid.to(device),
                       None if self.features is None else self.features.to(device), top)


def sample_windows(rows: list[dict], batch_size: int, seq_len: int, pad_id: int, generator: torch.Generator,
                   part: tuple[int, int] = (0, 1)) -> Windows:
    """A batch of `seq_len`-token windows over prompt + response, with the cached verifier features and top-k of
    those tokens when the rows carry them (`feature_cache`, `kl_top_k`).

    Windows end inside the response (where drafting happens); shorter sequences are right-padded (invalid).
    `part=(index, count)` keeps every count-th window from the index-th: one process's share of a global batch
    (the same draws in every process, so any number of processes trains on the same windows).
    """
    index, count = part
    mine = range(index, batch_size, count)
    ids = torch.full((len(mine), seq_len), pad_id, dtype=torch.long)
    valid = torch.zeros(len(mine), seq_len, dtype=torch.bool)
    features = torch.zeros(len(mine), seq_len, rows[0]["features"].shape[-1]) if "features" in rows[0] else None
    top = _empty_top_k(rows[0]["verifier_top_k"], len(mine), seq_len) if "verifier_top_k" in rows[0] else None
    picks = torch.randint(len(rows), (batch_size,), generator=generator).tolist()
    for b, pick in enumerate(picks):
        row = rows[pick]
        sequence = row["prompt_ids"] + row["response_ids"]
        end = len(sequence)
        if len(sequence) > seq_len:
            first_end = max(seq_len, len(row["prompt_ids"]) + 1)
            end = int(torch.randint(first_end, len(sequence) + 1, (1,), generator=generator))
        if b % count != index:
            continue
        start, b = max(0, end - seq_len), b // count
        ids[b, : end - start] = torch.tensor(sequence[start:end])
        valid[b, : end - start] = True
        if features is not None:
            features[b, : end - start] = row["features"][start:end].float()
        if top is not None:
            for window, cached in zip(top, row["verifier_top_k"]):
                window[b, : end - start] = cached[start:end]
    return Windows(ids, valid, features, top)


def _empty_top_k(cached: tuple[torch.Tensor, torch.Tensor], batch: int, seq_len: int):
    """Buffers [batch, seq_len, k] for the windows' top-k ids and log-probs (id 0 at log-prob -inf on padding)."""
    k = cached[0].shape[-1]
    return torch.zeros(batch, seq_len, k, dtype=torch.long), torch.full((batch, seq_len, k), float("-inf"))


# ----------------------------------------------------------------------------------------------------------------
# Loss and metrics


def training_loss(model, drafter, windows: Windows, config: TrainConfig, generator: torch.Generator, verifier=None,
                  part: tuple[int, int] = (0, 1)) -> torch.Tensor:
    """The configured objective on one batch of windows. `model` is what to call (the drafter, or its DDP
    wrapper); `drafter` the unwrapped drafter; `part` which rows of the global batch the windows are
    (`make_block_diffusion_batch`). What the windows do not carry (features, the verifier's distribution) comes
    from a teacher-forced `verifier`."""
    clean, valid, features, top_k = windows
    if config.kind == "ar":  # next-token cross-entropy on valid positions
        logits = model(input_ids=clean, attention_mask=valid.long()).logits[:, :-1]
        targets = clean[:, 1:].masked_fill(~valid[:, 1:], -100)
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=-100)
    conditioned = drafter.config.is_conditioned
    needs_logits = bool(config.kl_weight) and top_k is None
    teacher = _teacher_forward(verifier, drafter, clean, valid, logits=needs_logits) \
        if (conditioned and features is None) or needs_logits else None
    if conditioned and features is None:
        features = drafter.select_features(teacher.hidden_states)
    if config.objective == "mdlm":  # random masking ratios; the unaligned SpecDiff objective
        return _mdlm(model, drafter, clean, valid, config, generator, features, part)
    batch = make_block_diffusion_batch(clean, config.block_size, drafter.config.mask_token_index, config.noise,
                                       generator, conditioned, part)
    logits = block_logits(model, batch, features)
    targets = drafter.to_draft_vocab(batch.targets)
    targets = targets.masked_fill(~valid[:, batch.block_slice].reshape(targets.shape), -1)
    loss = streak_loss(logits, targets) if config.objective == "streak" else ce_streak_loss(logits, targets)
    if config.mdlm_weight:
        loss = loss + config.mdlm_weight * _mdlm(model, drafter, clean, valid, config, generator, features, part)
    if config.kl_weight:
        weights = kl_position_weights(config.kl_weighting, logits, targets, batch.masked)
        loss = loss + config.kl_weight * _kl_term(drafter, logits, batch, weights, teacher, top_k)
    return loss


def _kl_term(drafter, logits, batch, weights, teacher=None, top_k=None) -> torch.Tensor:
    """KL(verifier || drafter) on the blocks: from the windows' cached top-k, or the teacher's full logits."""
    def blocks(x):  # [B, L, ...] -> [B, num_blocks, block_size, ...]
        return x[:, batch.block_slice].reshape(*weights.shape, -1)

    if top_k is not None:  # cached per token: the verifier's prediction of it
        top_ids, top_log_probs = map(blocks, top_k)
        return top_k_kl_to_verifier(logits, drafter.to_draft_vocab(top_ids), top_log_probs, weights)
    # the verifier's logit at position t-1 predicts token t
    shifted = blocks(torch.cat([teacher.logits[:, :1], teacher.logits[:, :-1]], dim=1))
    ids = drafter.draft_vocab_ids(shifted.device)
    return kl_to_verifier(logits, shifted if ids is None else shifted[..., ids], weights)


def _mdlm(model, drafter, clean, valid, config, generator, features=None, part=(0, 1)):
    batch = make_block_diffusion_batch(clean, config.block_size, drafter.config.mask_token_index, "random", generator,
                                       drafter.config.is_conditioned, part)
    targets = drafter.to_draft_vocab(batch.targets)
    targets = targets.masked_fill(~valid[:, batch.block_slice].reshape(targets.shape), -1)
    return mdlm_loss(block_logits(model, batch, features), targets, batch.masked, batch.mask_ratio)


@torch.no_grad()
def _teacher_forward(verifier, drafter, ids: torch.Tensor, valid: torch.Tensor, logits: bool = False):
    """The verifier teacher-forced on `ids` [B, L]: the hidden states a conditioned drafter reads, and its logits at
    every position if `logits` (else only at the last one: the head over the whole vocabulary is costly)."""
    if verifier is None:
        raise ValueError("a conditioned drafter (or kl_weight) trains on the verifier's outputs: pass the verifier")
    hidden = drafter.verifier_hidden_states if drafter.config.is_conditioned else False
    return verifier(input_ids=ids, attention_mask=valid.long(), output_hidden_states=hidden,
                    logits_to_keep=0 if logits else 1)


def verifier_features(verifier, drafter, ids: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """What a conditioned drafter reads, by teacher forcing the verifier on `ids` [B, L]: [B, L, F]."""
    return drafter.select_features(_teacher_forward(verifier, drafter, ids, valid).hidden_states)


@torch.no_grad()
def held_out_metrics(drafter, windows: Windows, block_size: int, verifier=None) -> dict:
    """One-step (T=1) drafting quality on held-out windows (`sample_windows`' output): greedy acceptance by
    position, the greedy accepted streak (tau - 1 under greedy verification) and the expected streak under
    speculative sampling. A conditioned drafter needs the windows' features or the `verifier`."""
    clean, valid, features = windows.ids, windows.valid, windows.features
    conditioned = drafter.config.is_conditioned
    batch = make_block_diffusion_batch(clean, block_size, drafter.config.mask_token_index, "full",
                                       torch.Generator().manual_seed(0), conditioned)
    if conditioned and features is None:
        features = verifier_features(verifier, drafter, clean, valid)
    logits = block_logits(drafter, batch, features).float()
    targets = drafter.to_draft_vocab(batch.targets)
    block_valid = valid[:, batch.block_slice].reshape(targets.shape).all(-1)
    logits, targets = logits[block_valid], targets[block_valid]
    if not len(targets):
        return {}
    hits = (logits.argmax(-1) == targets).long().cumprod(-1).float()
    expected = target_log_probs(logits, targets).cumsum(-1).exp()
    return {"acceptance_by_position": [round(x, 4) for x in hits.mean(0).tolist()],
            "greedy_streak": hits.sum(-1).mean().item(), "expected_streak": expected.sum(-1).mean().item(),
            "blocks": len(targets)}


# ----------------------------------------------------------------------------------------------------------------
# Checkpoints


def save_checkpoint(out: Path, drafter, optimizer, scheduler, step: int, config: TrainConfig,
                    wall_time_s: float = 0.0):
    """Write out/checkpoint atomically (a staging folder renamed into place). `wall_time_s`: what the run's steps
    so far took, over all its sessions."""
    staging, final, old = out / "checkpoint.tmp", out / "checkpoint", out / "checkpoint.old"
    shutil.rmtree(staging, ignore_errors=True)
    drafter.save_pretrained(staging)
    torch.save({"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}, staging / "trainer.pt")
    (staging / "state.json").write_text(json.dumps({"step": step, "config": asdict(config),
                                                       "wall_time_s": round(wall_time_s, 1)}))
    if final.exists():
        shutil.rmtree(old, ignore_errors=True)
        final.rename(old)
    staging.rename(final)
    shutil.rmtree(old, ignore_errors=True)


def latest_checkpoint(out: Path) -> Path | None:
    for name in ("checkpoint", "checkpoint.old"):  # .old survives a crash between the two renames
        if (out / name / "state.json").exists():
            return out / name
    return None


# ----------------------------------------------------------------------------------------------------------------
# The run


@dataclass
class TrainingRun:
    """The state of one training run, as `train`'s named steps build and advance it."""

    config: TrainConfig
    accelerator: object
    sources: list[DataSource]
    rows: list[dict]
    train_rows: list[dict]
    eval_rows: list[dict]
    verifier: object  # None once neither features nor targets are needed from it
    drafter: object  # the unwrapped drafter
    model: object = None  # what to call: the drafter, or its distributed wrapper
    optimizer: object = None
    scheduler: object = None
    start: int = 0  # the step the run starts (or resumes) at
    checkpoint: Path | None = None  # the checkpoint it resumes from
    wall_time_before: float = 0.0  # seconds the steps before `start` took (in earlier sessions)
    eval_windows: Windows | None = None

    @property
    def out(self) -> Path:
        return Path(self.config.out)

    @property
    def pad_id(self) -> int:
        return self.drafter.config.pad_token_id if self.drafter.config.pad_token_id is not None else 0


def train(config: TrainConfig, progress: bool = True) -> Path:
    """Train a drafter as `config` says; resumes from `config.out/checkpoint` if one is there. Returns `out`."""
    from accelerate import Accelerator

    _validate(config)
    # bf16 autocast is ours rather than accelerate's, so several runs can share one process (accelerate keeps one
    # global state per process and refuses a second mixed-precision setting).
    accelerator = Accelerator(cpu=_several_cpu_processes())
    if config.batch_size % accelerator.num_processes:
        raise ValueError(f"batch_size {config.batch_size} is the global batch: it must divide evenly over the "
                         f"{accelerator.num_processes} processes")
    saved = _saved_state(config)
    if saved is not None and saved["step"] >= config.max_steps:  # finished: its drafter and recipe stay as they are
        if progress and accelerator.is_main_process:
            print(f"{config.out} is trained ({config.max_steps} steps)")
        return Path(config.out)
    run = _load_run(config, accelerator, progress, saved)
    _prepare_optimization(run)
    show = progress and run.accelerator.is_main_process
    run.out.mkdir(parents=True, exist_ok=True)
    log = (run.out / "log.jsonl").open("a") if run.accelerator.is_main_process else None
    if log is not None and run.eval_windows is not None and run.start == 0 and init_folder(config) is not None:
        _write_log(log, {"step": 0, **_held_out(run)})  # where the drafter trained further starts from
    began = time.time()
    bar = tqdm(total=config.max_steps, initial=run.start, desc="train", disable=not show)
    for step in range(run.start, config.max_steps):
        loss = training_step(run, step)
        done = step + 1
        record = {"step": done, "loss": round(loss, 5), "lr": run.scheduler.get_last_lr()[0]}
        if run.eval_windows is not None and (done % config.eval_every == 0 or done == config.max_steps):
            record.update(_held_out(run))
        if done % config.log_every == 0 or "greedy_streak" in record:
            _write_log(log, record)
        bar.set_postfix(loss=f"{loss:.3f}", **({"streak": f"{record['greedy_streak']:.2f}"}
                                               if "greedy_streak" in record else {}))
        bar.update(1)
        if run.accelerator.is_main_process and done % config.save_every == 0 and done < config.max_steps:
            save_checkpoint(run.out, run.drafter, run.optimizer, run.scheduler, done, config,
                            run.wall_time_before + time.time() - began)
        run.accelerator.wait_for_everyone()
    bar.close()
    if run.accelerator.is_main_process:
        _save_result(run, time.time() - began)
        log.close()
    return run.out


def _load_run(config: TrainConfig, accelerator, progress: bool, saved: dict | None) -> TrainingRun:
    """The data (checked against the verifier, split), and the drafter: resumed from the checkpoint whose state is
    `saved`, or built."""
    from ..tools.verifiers import load_verifier

    verifier, _ = load_verifier(config.verifier, dtype=torch.float32, device=accelerator.device)
    sources = load_training_data(config.data, verifier, config.verifier)
    rows = [row for source in sources for row in source.rows]
    train_rows, eval_rows = split_rows(rows, config.eval_fraction)
    if config.max_train_rows:
        draw = torch.randperm(len(train_rows), generator=torch.Generator().manual_seed(0))[: config.max_train_rows]
        train_rows = [train_rows[i] for i in sorted(draw.tolist())]
    if not train_rows:
        raise ValueError("no training rows left after the held-out split: lower eval_fraction or add prompts")
    drafter = _resume_or_build(config, verifier, train_rows, saved)
    run = TrainingRun(config, accelerator, sources, rows, train_rows, eval_rows, verifier, drafter)
    if saved is not None:
        run.start, run.checkpoint = saved["step"], saved["checkpoint"]
        run.wall_time_before = saved.get("wall_time_s", 0.0)
    cached = config.feature_cache and config.kind == "diffusion" and drafter.config.is_conditioned
    top_k = config.kl_top_k if cached and config.kl_weight else 0
    if cached:
        teacher = functools.cache(lambda: _feature_verifier(verifier, config.precision))  # made only if needed
        with accelerator.main_process_first():
            for source in sources:
                attach_features(source.folder, teacher, drafter, source.rows, top_k,
                                progress and accelerator.is_main_process)
        teacher.cache_clear()
    if not (config.kl_weight and not top_k) and (not config.verifier_layers or cached):
        run.verifier = None  # a dflash drafter keeps the verifier's embeddings and head
    elif config.precision == "bf16":
        verifier.to(torch.bfloat16)  # it only gives targets or features: half the cost
    if eval_rows and config.kind == "diffusion":
        run.eval_windows = sample_windows(eval_rows, min(64, 4 * len(eval_rows)), config.seq_len, run.pad_id,
                                          torch.Generator().manual_seed(config.seed)).to(accelerator.device)
    return run


def _feature_verifier(verifier, precision: str):
    """The verifier that computes missing cached features: a bf16 copy for a bf16 run (about twice as fast on a
    CPU with bf16 matmuls, and the precision the drafter meets at drafting time), else `verifier` itself."""
    return copy.deepcopy(verifier).to(torch.bfloat16) if precision == "bf16" else verifier


def _saved_state(config: TrainConfig) -> dict | None:
    """The state of the checkpoint in `config.out` (step, settings, wall time), None if there is none; an error if
    it is a run with other settings."""
    checkpoint = latest_checkpoint(Path(config.out))
    if checkpoint is None:
        return None
    saved = json.loads((checkpoint / "state.json").read_text())
    saved["config"] = {**asdict(replace(config, **_defaults())), **saved["config"]}  # fields added since: defaults
    if saved["config"] != asdict(config):
        changed = {k for k in saved["config"] if saved["config"][k] != asdict(config).get(k)}
        raise ValueError(f"{config.out} holds a checkpoint of a run with other settings ({sorted(changed)}): "
                         "use another --out, or the same settings to resume")
    return {**saved, "checkpoint": checkpoint}


def _resume_or_build(config: TrainConfig, verifier, train_rows: list[dict], saved: dict | None):
    """The drafter to train: from the checkpoint whose state is `saved`, else a new one."""
    from transformers import AutoModelForCausalLM

    if saved is None:
        return build_drafter(config, verifier, train_rows)
    drafter = AutoModelForCausalLM.from_pretrained(saved["checkpoint"], dtype=torch.float32)
    if config.kind == "diffusion":
        drafter.set_verifier(verifier)
    return drafter


def _defaults() -> dict:
    """TrainConfig's defaults (of the fields that have one)."""
    return {f.name: f.default for f in fields(TrainConfig) if f.default is not MISSING}


def _prepare_optimization(run: TrainingRun):
    """AdamW and a cosine schedule with warm-up (restored when resuming), prepared by accelerate."""
    from transformers import get_cosine_schedule_with_warmup

    config = run.config
    run.drafter.train()
    optimizer = torch.optim.AdamW(run.drafter.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    scheduler = get_cosine_schedule_with_warmup(optimizer, config.warmup_steps, config.max_steps)
    if run.checkpoint is not None:
        state = torch.load(run.checkpoint / "trainer.pt", weights_only=True)  # tensors and plain containers only
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
    # The scheduler stays unprepared: accelerate would step it once per process, for per-process batches.
    run.model, run.optimizer = run.accelerator.prepare(run.drafter, optimizer)
    run.scheduler = scheduler
    run.drafter = run.accelerator.unwrap_model(run.model)


def training_step(run: TrainingRun, step: int) -> float:
    """One optimizer step over `grad_accum` micro-batches of `batch_size` windows (the global batch: each process
    trains on its share). The windows are drawn from a generator seeded by (seed, step), the same in every process,
    the noise as well, each process keeping its rows', so the run does not depend on the number of processes.
    Returns the step's loss, averaged over processes."""
    config, accelerator = run.config, run.accelerator
    windows = torch.Generator().manual_seed(config.seed * 1_000_003 + step)
    noise = torch.Generator().manual_seed((config.seed * 1_000_003 + step) * 1009)
    part = (accelerator.process_index, accelerator.num_processes)
    total = 0.0
    for micro in range(config.grad_accum):
        batch = sample_windows(run.train_rows, config.batch_size, config.seq_len, run.pad_id, windows, part)
        batch = batch.to(accelerator.device)
        sync = micro == config.grad_accum - 1  # all-reduce gradients on the last micro-batch only
        autocast = torch.autocast(accelerator.device.type, dtype=torch.bfloat16, enabled=config.precision == "bf16")
        with autocast, (nullcontext() if sync else accelerator.no_sync(run.model)):
            loss = training_loss(run.model, run.drafter, batch, config, noise, run.verifier, part) / config.grad_accum
            accelerator.backward(loss)
        total += loss.item()
    if accelerator.num_processes > 1:
        total = accelerator.reduce(torch.tensor(total, device=accelerator.device), reduction="mean").item()
    if not math.isfinite(total):
        raise FloatingPointError(f"loss is {total} at step {step}: lower lr, or check the data")
    accelerator.clip_grad_norm_(run.model.parameters(), config.max_grad_norm)
    run.optimizer.step()
    run.scheduler.step()
    run.optimizer.zero_grad()
    return total


def _held_out(run: TrainingRun) -> dict:
    run.model.eval()
    metrics = held_out_metrics(run.drafter, run.eval_windows, run.config.block_size, run.verifier)
    run.model.train()
    return metrics


def _write_log(log, record: dict):
    if log is not None:
        log.write(json.dumps(record) + "\n")
        log.flush()


def _save_result(run: TrainingRun, seconds: float):
    """The trained drafter, its training recipe (with the recipe of the drafter it started from) and a checkpoint."""
    config, out = run.config, run.out
    run.drafter.eval().save_pretrained(out)
    recipe = {"config": asdict(config), "steps": config.max_steps, "resumed_from_step": run.start,
              "wall_time_s": round(run.wall_time_before + seconds, 1), "machine": _machine(run.accelerator),
              "data": {"rows": len(run.rows), "train_rows": len(run.train_rows), "held_out_rows": len(run.eval_rows),
                       "verifier": run.sources[0].meta["verifier"], "settings": run.sources[0].meta["settings"],
                       "sources": [{"folder": source.folder, "rows": len(source.rows),
                                    "settings": source.meta["settings"]} for source in run.sources]}}
    folder = init_folder(config)
    if folder is not None and (folder / "training_recipe.json").is_file():
        recipe["init_recipe"] = json.loads((folder / "training_recipe.json").read_text())
    (out / "training_recipe.json").write_text(json.dumps(recipe, indent=2))
    save_checkpoint(out, run.drafter, run.optimizer, run.scheduler, config.max_steps, config,
                    run.wall_time_before + seconds)


def _several_cpu_processes() -> bool:
    """Whether this is one of several processes on a machine without a GPU (`accelerate launch --multi_gpu` or
    `torchrun` there): accelerate then needs `cpu=True` to join them (gloo); without it each would train alone."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size == 1 and os.environ.get("ACCELERATE_USE_CPU", "").lower() in ("true", "1") and \
            "MASTER_PORT" in os.environ:
        warnings.warn("`accelerate launch --cpu --num_processes N` starts one process (accelerate's multi-CPU launch "
                      "needs mpirun): for N CPU processes use `accelerate launch --multi_gpu --num_processes N` or "
                      "`torchrun --nproc_per_node N`")
    return world_size > 1 and not torch.cuda.is_available()


def _machine(accelerator) -> str:
    device = accelerator.device
    if device.type == "cuda":
        return f"{accelerator.num_processes} x {torch.cuda.get_device_name(device)}"
    processes = f", {accelerator.num_processes} processes" if accelerator.num_processes > 1 else ""
    return (f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch threads "
            f"{torch.get_num_threads()}{processes}")


def _validate(config: TrainConfig):
    if config.kind not in ("diffusion", "ar"):
        raise ValueError(f"kind must be diffusion or ar, got {config.kind!r}")
    if init_folder(config) is not None and not (init_folder(config) / "config.json").is_file():
        raise ValueError(f"init must be random, from-verifier or a drafter folder; {config.init!r} is none of these")
    if config.init_layers and config.init != "from-verifier":
        raise ValueError("init_layers copies verifier layers: it needs init=from-verifier")
    if config.layout not in ("specdiff", "dflash"):
        raise ValueError(f"layout must be specdiff or dflash, got {config.layout!r}")
    if config.layout == "dflash" and (config.kind != "diffusion" or not config.verifier_layers):
        raise ValueError("layout=dflash is a conditioned diffusion drafter: set verifier_layers (e.g. 'auto')")
    if config.kind == "ar" and config.verifier_layers:
        raise ValueError("verifier_layers makes a conditioned diffusion drafter: it does not apply to kind=ar")
    if config.verifier_layers not in ("", "auto") and not all(
            part.strip().isdigit() for part in config.verifier_layers.split(",")):
        raise ValueError(f"verifier_layers must be empty, 'auto' or a list like '1,14,28', got {config.verifier_layers!r}")
    if config.objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {OBJECTIVES}, got {config.objective!r}")
    if config.kl_weighting not in KL_WEIGHTINGS:
        raise ValueError(f"kl_weighting must be one of {KL_WEIGHTINGS}, got {config.kl_weighting!r}")
    if config.kl_top_k < 0:
        raise ValueError(f"kl_top_k must be >= 0, got {config.kl_top_k}")
    if config.objective == "mdlm" and (config.kl_weight or config.mdlm_weight):
        raise ValueError("kl_weight and mdlm_weight add terms to a streak objective; objective=mdlm takes neither")
    if config.noise not in NOISE_MODES:
        raise ValueError(f"noise must be one of {NOISE_MODES}, got {config.noise!r}")
    if config.precision not in ("fp32", "bf16"):
        raise ValueError(f"precision must be fp32 or bf16, got {config.precision!r}")
    if config.block_size + 1 > config.seq_len:
        raise ValueError(f"block_size {config.block_size} needs seq_len > block_size (got {config.seq_len})")
    if config.max_steps < 1 or config.batch_size < 1 or config.grad_accum < 1:
        raise ValueError("max_steps, batch_size and grad_accum must be >= 1")


def config_fields():
    """(name, type, default, help) of every TrainConfig field, for command-line parsers."""
    for f in fields(TrainConfig):
        default = None if f.default is f.default_factory else f.default
        yield f.name, f.type, default, f.metadata.get("help", "")
