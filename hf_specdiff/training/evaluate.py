"""Drafter quality against its verifier on held-out prompts: tau and acceptance by draft position."""

import copy
import json
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ..compat import check_compatibility
from .data import encode_prompt
from ..decoding import SpecDiffStats, generate
from ..tools.threads import torch_threads


@torch.no_grad()
def evaluate_drafter(verifier, tokenizer, drafter, prompts: list, num_drafts: int = 1, draft_length: int | None = None,
                     num_denoising_steps: int | None = None, max_new_tokens: int = 128, do_sample: bool = False,
                     progress: bool = True, threads: int | None = None) -> dict:
    """Decode `prompts` with the drafter and return tau, acceptance by position and drafter forwards per round.
    `threads` sets torch's thread count for the call; the caller's count is restored on return."""
    with torch_threads(threads):
        check_compatibility(verifier, drafter)
        steps = num_denoising_steps or drafter.config.num_denoising_steps
        drafter = _with_steps(drafter, steps)
        stats = SpecDiffStats()
        for prompt in tqdm(prompts, desc="eval-drafter", disable=not progress):
            ids = torch.tensor([encode_prompt(tokenizer, prompt, True, 2048)], device=verifier.device)
            generate(verifier, drafter, ids, max_new_tokens=max_new_tokens, do_sample=do_sample,
                     num_drafts=num_drafts, draft_length=draft_length, stats=stats)
    return {"prompts": len(prompts), "num_drafts": num_drafts, "draft_length": draft_length,
            "num_denoising_steps": steps, **stats.as_dict()}


def _with_steps(drafter, steps: int):
    """`drafter`, or a view of it (the same weights) that denoises in `steps` steps: the caller's stays as it is."""
    if steps == drafter.config.num_denoising_steps:
        return drafter
    view = copy.copy(drafter)
    view.config = copy.deepcopy(drafter.config)
    view.config.num_denoising_steps = steps
    return view


def format_report(report: dict) -> str:
    """A markdown table of an `evaluate_drafter` report."""
    lines = [f"tau (tokens per verifier forward): {report['tau']:.3f} over {report['rounds']} rounds, "
             f"{report['prompts']} prompts (K={report['num_drafts']}, T={report['num_denoising_steps']})", "",
             "| position | acceptance |", "|---|---|"]
    lines += [f"| {i + 1} | {a:.3f} |" for i, a in enumerate(report["acceptance_by_position"])]
    return "\n".join(lines)


def plot_acceptance(reports: dict[str, dict], path) -> Path | None:
    """PNG of acceptance by draft position, one line per report; None if matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for name, report in reports.items():
        rates = report["acceptance_by_position"]
        ax.plot(range(1, len(rates) + 1), rates, marker="o", label=f"{name} (tau {report['tau']:.2f})")
    ax.set_xlabel("draft position")
    ax.set_ylabel("acceptance rate")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)


def save_report(report: dict, out) -> None:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "eval.json").write_text(json.dumps(report, indent=2))
    (out / "eval.md").write_text(format_report(report) + "\n")
    plot_acceptance({"drafter": report}, out / "acceptance_by_position.png")
