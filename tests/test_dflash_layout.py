"""The dflash layout: a conditioned drafter at the verifier's width that embeds and predicts with the verifier's
own embedding table and head, and runs through transformers' `speculation_type="dflash"` loop as well as ours."""

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM
from transformers.generation.candidate_generator import DFlashTokenCandidateGenerator

import hf_specdiff
import hf_specdiff.generation_specdiff as generation
from hf_specdiff.decoding import TreeDecoding
from helpers import (DFLASH_PROMPTS, run_as_remote_code, sampled_sequences, sharp_verifier, tiny_dflash_drafter,
                     tiny_drafter, tiny_verifier, train_briefly, trained_dflash)
from stats import SAMPLES, chi_square_pvalue, exact_first_two

PROMPTS = DFLASH_PROMPTS
KWARGS = dict(max_new_tokens=30, do_sample=False, eos_token_id=None)


@pytest.fixture(scope="module")
def trained():
    return trained_dflash


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_greedy_equals_plain_through_every_entry_point(trained, arch):
    verifier, drafter = trained(arch)
    for prompt in PROMPTS[:2].split(1):
        expected = verifier.generate(prompt, **KWARGS).tolist()
        for num_drafts, lookup in ((1, 0), (4, 0), (4, 3)):
            stats = hf_specdiff.SpecDiffStats()
            out = hf_specdiff.generate(verifier, drafter, prompt, num_drafts=num_drafts, lookup_tokens=lookup,
                                       draft_length=4, max_tree_nodes=12, stats=stats, **KWARGS)  # timings do not decide
            assert out.tolist() == expected
            assert stats.tau > 1.5, stats.as_dict()  # the drafts were used: embeddings, head and features right
        out = verifier.generate(prompt, custom_generate=hf_specdiff.specdiff_generate, drafter=drafter, **KWARGS)
        assert out.tolist() == expected
        assert verifier.generate(prompt, assistant_model=drafter, speculation_type="dflash", **KWARGS).tolist() \
            == expected
        try:
            assert verifier.generate(prompt, assistant_model=drafter.attach(verifier), **KWARGS).tolist() == expected
        finally:
            drafter.detach()


def _record_drafts(monkeypatch, generator_class, drafts):
    original = generator_class.get_candidates

    def get_candidates(self, input_ids, *args, **kwargs):
        candidates, logits = original(self, input_ids, *args, **kwargs)
        if candidates.shape[1] > input_ids.shape[1]:
            drafts.append((input_ids.shape[1], candidates[0, input_ids.shape[1]:].tolist()))
        return candidates, logits

    monkeypatch.setattr(generator_class, "get_candidates", get_candidates)


def _record_tree_drafts(monkeypatch, drafts):
    """Record (sequence length, draft) of every round of our loop that drafted one draft."""
    original = TreeDecoding.draft_tree

    def draft_tree(self, input_ids, cache):
        round_ = original(self, input_ids, cache)
        if len(round_.drafts) == 1:
            drafts.append((input_ids.shape[1], list(round_.drafts[0])))
        return round_

    monkeypatch.setattr(TreeDecoding, "draft_tree", draft_tree)


def test_transformers_dflash_loop_drafts_what_our_loop_drafts(trained, monkeypatch):
    """Round by round, transformers' DFlash loop and our K=1 loop (drafting block_size - 1 tokens, as it does) propose
    the same tokens after the same sequence."""
    verifier, drafter = trained("qwen3")
    theirs, ours = [], []
    _record_drafts(monkeypatch, DFlashTokenCandidateGenerator, theirs)
    _record_tree_drafts(monkeypatch, ours)
    for prompt in PROMPTS[2:5].split(1):
        kwargs = dict(max_new_tokens=60, do_sample=False, eos_token_id=None)
        verifier.generate(prompt, assistant_model=drafter, speculation_type="dflash", **kwargs)
        hf_specdiff.generate(verifier, drafter, prompt, draft_length=drafter.config.block_size - 1, **kwargs)
    full = [(start, draft) for start, draft in ours if len(draft) == drafter.config.block_size - 1]
    assert len(full) >= 6 and sum(len(d) for _, d in ours) > 0
    assert all(round_ in theirs for round_ in full)


def test_save_reload_stores_no_embeddings_or_head(trained, tmp_path):
    verifier, drafter = trained("llama")
    drafter.save_pretrained(tmp_path / "d")
    keys = set(load_file(tmp_path / "d" / "model.safetensors"))
    assert not any("embed" in k or "lm_head" in k for k in keys), keys
    assert {"model.context_proj.weight", "model.layers.0.self_attn.q_norm.weight"} <= keys
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "d").eval()
    assert loaded.config.layout == "dflash" and loaded.config.target_layer_ids == drafter.config.verifier_layer_ids
    with pytest.raises(ValueError, match="dflash layout: it embeds and predicts with the verifier's"):
        loaded(PROMPTS[:1, :3], verifier_features=torch.zeros(1, 0, len(drafter.config.target_layer_ids) * 64))
    loaded.set_verifier(verifier)
    cache_a, cache_b = drafter.new_cache(), loaded.new_cache()
    features = hf_specdiff.training.trainer.verifier_features(verifier, drafter, PROMPTS[:1], torch.ones(1, 6, dtype=bool))
    for cache in (cache_a, cache_b):
        cache.verifier_features.record(0, PROMPTS[0], features[0])
    _, scores_a = drafter.draft(PROMPTS[:1], cache_a, 7)
    _, scores_b = loaded.draft(PROMPTS[:1], cache_b, 7)
    assert torch.equal(scores_a, scores_b)


@pytest.mark.slow
def test_fresh_process_runs_remote_code_through_both_loops(trained, tmp_path):
    """Loaded as remote code (no hf_specdiff), the drafter runs through transformers' DFlash loop and attached."""
    verifier, drafter = trained("qwen3")
    run_as_remote_code(tmp_path, verifier, drafter, f"""
        prompt = torch.tensor({PROMPTS[:1].tolist()})
        kwargs = dict(max_new_tokens=24, do_sample=False, eos_token_id=None)
        plain = verifier.generate(prompt, **kwargs).tolist()
        calls = []
        drafter.register_forward_pre_hook(lambda *_: calls.append(1))
        assert verifier.generate(prompt, assistant_model=drafter, speculation_type="dflash", **kwargs).tolist() == plain
        assert verifier.generate(prompt, assistant_model=drafter.attach(verifier), **kwargs).tolist() == plain
        assert len(calls) > 4, calls
    """)


def test_errors_name_the_fix():
    verifier = tiny_verifier("llama")
    config = tiny_dflash_drafter(verifier).config
    with pytest.raises(ValueError, match="must equal verifier_hidden_size"):
        hf_specdiff.SpecDiffConfig(**{**config.to_diff_dict(), "hidden_size": 32, "head_dim": 8})
    with pytest.raises(ValueError, match="needs a mask_token_id in the verifier's vocabulary"):
        hf_specdiff.SpecDiffConfig(**{**config.to_diff_dict(), "mask_token_id": 96})
    unattached = hf_specdiff.SpecDiffDrafter(config).eval()
    with pytest.raises(ValueError, match=r"drafter.set_verifier\(verifier\)"):
        unattached(PROMPTS[:1], verifier_features=torch.zeros(1, 0, len(config.target_layer_ids) * 64))
    with pytest.raises(ValueError, match=r"assistant_model=drafter.attach\(verifier\)"):
        verifier.generate(PROMPTS[:1], assistant_model=unattached, max_new_tokens=4, do_sample=False)
    own_weights = tiny_drafter(verifier, conditioned=True)  # called as transformers' DFlash loop calls a drafter
    with pytest.raises(ValueError, match="needs a drafter of layout 'dflash'"):
        own_weights(noise_embeds=torch.zeros(1, 8, 64), context_hidden_states=torch.zeros(1, 3, 64))


# ---- sampling ------------------------------------------------------------------------------------------------



TEMPERATURE = 2.0


@pytest.fixture(scope="module")
def small():
    verifier, prompt = sharp_verifier(8)
    drafter = tiny_dflash_drafter(verifier, block_size=4)
    train_briefly(drafter, sampled_sequences(verifier, prompt, 64, 12), steps=40, verifier=verifier)
    # At temperature 2 the target is flat enough that the biased drafter below is off by far (chi-square p ~ 1e-34
    # at 500 generations; at temperature 1 the trained drafter's argmax is nearly always the sample: p ~ 1e-4).
    return verifier, drafter, prompt, exact_first_two(verifier, prompt, temperature=TEMPERATURE)


def _sample_pairs(verifier, drafter, prompt, route):
    stats = hf_specdiff.SpecDiffStats()
    torch.manual_seed(1)
    pairs = []
    for _ in range(SAMPLES):
        kwargs = dict(max_new_tokens=3, do_sample=True, top_k=None, eos_token_id=None, temperature=TEMPERATURE)
        if route == "transformers-dflash":
            out = verifier.generate(prompt, assistant_model=drafter, speculation_type="dflash", **kwargs)
        else:
            out = hf_specdiff.generate(verifier, drafter, prompt, num_drafts=4 if route == "K4" else 1,
                                       draft_length=2, stats=stats, **kwargs)
        pairs.append(out[0, prompt.shape[1]: prompt.shape[1] + 2])
    return torch.stack(pairs), stats


@pytest.mark.slow
@pytest.mark.parametrize("route", ["K1", "K4", "transformers-dflash"])
def test_sampling_matches_target(small, route):
    verifier, drafter, prompt, exact = small
    pairs, stats = _sample_pairs(verifier, drafter, prompt, route)
    assert chi_square_pvalue(pairs, exact) > 1e-3
    if route != "transformers-dflash":  # both accept and reject paths ran
        assert 0.2 < stats.acceptance_by_position[0] < 0.99, stats.as_dict()


@pytest.mark.slow
def test_chi_square_catches_a_biased_dflash_drafter(small, monkeypatch):
    verifier, drafter, prompt, exact = small
    # Deliberately wrong: draft the argmax but report the softmax as the distribution it was drawn from.
    monkeypatch.setattr(generation, "select_tokens", lambda scores, do_sample, generator=None: scores.argmax(-1))
    pairs, _ = _sample_pairs(verifier, drafter, prompt, "K1")
    assert chi_square_pvalue(pairs, exact) < 1e-3
