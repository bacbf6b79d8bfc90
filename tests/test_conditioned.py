"""The conditioned drafter: it reads the verifier's hidden states, through both entry points, still lossless."""

import pytest
import torch
from transformers import AutoModelForCausalLM

import hf_specdiff
from hf_specdiff.training.block_diffusion import block_logits, make_block_diffusion_batch
from hf_specdiff.generation_specdiff import VerifierFeatures, VerifierHooks
from hf_specdiff.training.trainer import verifier_features
from helpers import (greedy_sequences, sampled_sequences, sharp_verifier, tiny_drafter, tiny_gemma3, tiny_verifier,
                     train_briefly)
from stats import SAMPLES, chi_square_pvalue, exact_first_two

PROMPTS = torch.randint(3, 96, (12, 6), generator=torch.Generator().manual_seed(5))
VERIFIERS = {"llama": lambda: tiny_verifier("llama"), "qwen2": lambda: tiny_verifier("qwen2"), "gemma3": tiny_gemma3}


@pytest.fixture(scope="module")
def trained():
    cache = {}

    def get(arch):
        if arch not in cache:
            verifier = VERIFIERS[arch]()
            drafter = tiny_drafter(verifier, block_size=8, conditioned=True)
            train_briefly(drafter, greedy_sequences(verifier, PROMPTS, 40), steps=120, verifier=verifier)
            cache[arch] = verifier, drafter
        return cache[arch]

    return get


def plain(verifier, prompt, **kwargs):
    return verifier.generate(prompt, max_new_tokens=30, do_sample=False, eos_token_id=None, **kwargs)


@pytest.mark.parametrize("arch", list(VERIFIERS))
def test_greedy_equals_plain_through_every_entry_point(trained, arch):
    verifier, drafter = trained(arch)
    for prompt in PROMPTS[:2].split(1):
        expected = plain(verifier, prompt).tolist()
        for num_drafts in (1, 4):
            stats = hf_specdiff.SpecDiffStats()
            out = hf_specdiff.generate(verifier, drafter, prompt, max_new_tokens=30, do_sample=False,
                                       eos_token_id=None, num_drafts=num_drafts, draft_length=4, max_tree_nodes=12,
                                       stats=stats)  # timings do not decide
            assert out.tolist() == expected
            assert stats.tau > 1.5, stats.as_dict()  # the drafts were used, so the features were right
        out = verifier.generate(prompt, custom_generate=hf_specdiff.specdiff_generate, drafter=drafter,
                                max_new_tokens=30, do_sample=False, eos_token_id=None)
        assert out.tolist() == expected
        try:
            assert plain(verifier, prompt, assistant_model=drafter.attach(verifier)).tolist() == expected
        finally:
            drafter.detach()


def test_a_context_window_restarts_the_drafter_and_stays_lossless(trained, monkeypatch):
    """A conditioned drafter whose context_window is shorter than the context restarts its cache from the recent
    tokens (reading their features again) on every path, and the output is still plain greedy's."""
    verifier, drafter = trained("llama")
    restarts = []
    reset = hf_specdiff.SpecDiffCache.reset
    monkeypatch.setattr(hf_specdiff.SpecDiffCache, "reset",
                        lambda cache, offset=0: (restarts.append(offset), reset(cache, offset))[1])
    monkeypatch.setattr(drafter.config, "context_window", 20)
    prompt = PROMPTS[:1]
    expected = plain(verifier, prompt).tolist()
    for options in (dict(num_drafts=1), dict(num_drafts=4, lookup_tokens=4)):
        out = hf_specdiff.generate(verifier, drafter, prompt, max_new_tokens=30, do_sample=False, eos_token_id=None,
                                   draft_length=4, max_tree_nodes=12, **options)
        assert out.tolist() == expected
    try:
        assert plain(verifier, prompt, assistant_model=drafter.attach(verifier)).tolist() == expected
    finally:
        drafter.detach()
    assert sum(offset > 0 for offset in restarts) >= 3, restarts


def test_eos_stops_where_plain_decoding_stops(trained):
    verifier, drafter = trained("llama")
    prompt = PROMPTS[:1]
    eos = int(plain(verifier, prompt)[0, prompt.shape[1] + 9])
    expected = verifier.generate(prompt, max_new_tokens=30, do_sample=False, eos_token_id=eos)
    assert expected[0, -1] == eos
    for num_drafts in (1, 4):
        out = hf_specdiff.generate(verifier, drafter, prompt, max_new_tokens=30, do_sample=False, eos_token_id=eos,
                                   num_drafts=num_drafts)
        assert out.tolist() == expected.tolist()


def test_attach_and_detach_leave_the_verifier_unchanged(trained):
    verifier, drafter = trained("qwen2")
    prompt = PROMPTS[3:4]
    before = plain(verifier, prompt)
    hooks_before = [len(m._forward_hooks) + len(m._forward_pre_hooks) for m in verifier.modules()]
    drafter.attach(verifier)
    drafter.attach(verifier)  # attaching twice keeps one set of hooks
    assert sum(len(m._forward_hooks) for m in verifier.modules()) == sum(hooks_before) + 1 + 1  # model + 1 layer
    try:
        assert plain(verifier, prompt).tolist() == before.tolist()  # used without the drafter while attached
        batch = PROMPTS[:3]
        assert torch.equal(verifier.generate(batch, max_new_tokens=5, do_sample=False, eos_token_id=None),
                           greedy_sequences(verifier, batch, 5))
    finally:
        drafter.detach()
    assert [len(m._forward_hooks) + len(m._forward_pre_hooks) for m in verifier.modules()] == hooks_before
    assert plain(verifier, prompt).tolist() == before.tolist()


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_hooks_record_what_output_hidden_states_returns(arch):
    verifier = tiny_verifier(arch) if arch != "gemma3" else tiny_gemma3()
    drafter = tiny_drafter(verifier, conditioned=True)
    store = VerifierFeatures()
    hooks = VerifierHooks(verifier, drafter.config.verifier_layer_ids, store)
    ids = PROMPTS[:1]
    with torch.no_grad():
        expected = verifier_features(verifier, drafter, ids, torch.ones_like(ids, dtype=torch.bool))[0]
    hooks.remove()
    assert torch.equal(store.token_ids, ids[0]) and torch.equal(store.features, expected)
    store.record(3, ids[0, 3:5], expected[3:5] + 1)  # a later forward from position 3 replaces the rest
    assert len(store) == 5 and store.usable_length(ids[0]) == 5
    assert torch.equal(store.features[3], expected[3] + 1)
    other = ids[0].clone()
    other[2] += 1
    assert store.usable_length(other) == 2  # features are valid for the common prefix only


def test_training_layout_matches_drafting_round_by_round():
    """Block logits of the one-forward training layout equal those of drafting with a cache kept across rounds."""
    verifier = tiny_verifier("llama")
    drafter = tiny_drafter(verifier, block_size=4, conditioned=True)
    clean = torch.randint(3, 96, (1, 23))
    features = verifier_features(verifier, drafter, clean, torch.ones_like(clean, dtype=torch.bool))
    batch = make_block_diffusion_batch(clean, 4, drafter.config.mask_token_index, "full",
                                       torch.Generator().manual_seed(1), conditioned=True)
    with torch.no_grad():
        train_logits = drafter.to_full_vocab(block_logits(drafter, batch, features))
    cache = drafter.new_cache()
    cache.verifier_features.record(0, clean[0], features[0])
    for b in range(train_logits.shape[1]):
        _, scores = drafter.draft(clean[:, : batch.block_slice.start + 4 * b], cache, 4, num_steps=1)
        torch.testing.assert_close(scores, train_logits[0, b], rtol=1e-4, atol=1e-4)


def test_save_and_reload(trained, tmp_path):
    verifier, drafter = trained("llama")
    drafter.save_pretrained(tmp_path / "cond")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "cond").eval()
    assert loaded.config.verifier_layer_ids == drafter.config.verifier_layer_ids
    out = hf_specdiff.generate(verifier, loaded, PROMPTS[:1], max_new_tokens=20, do_sample=False, eos_token_id=None,
                               num_drafts=2)
    assert out.tolist() == verifier.generate(PROMPTS[:1], max_new_tokens=20, do_sample=False,
                                             eos_token_id=None).tolist()


def test_errors_name_the_fix(trained):
    verifier, drafter = trained("llama")
    with pytest.raises(ValueError, match=r"assistant_model=drafter.attach\(verifier\)"):
        verifier.generate(PROMPTS[:1], assistant_model=drafter, max_new_tokens=4, do_sample=False)
    with pytest.raises(ValueError, match="conditioned on the verifier's hidden states"):
        drafter(PROMPTS[:1])
    wider = tiny_verifier("llama")
    wider.config.hidden_size = 32
    with pytest.raises(ValueError, match="Use a drafter trained for this verifier"):
        drafter.attach(wider)
    with pytest.raises(ValueError, match="verifier_layer_ids"):
        hf_specdiff.SpecDiffConfig(vocab_size=96, verifier_layer_ids=[])
    gemma = tiny_gemma3()
    with pytest.raises(ValueError, match="the verifier has 4 layers of width 64"):
        hf_specdiff.check_compatibility(gemma, tiny_drafter(gemma, conditioned=True, verifier_layer_ids=[3]))


# ---- sampling ------------------------------------------------------------------------------------------------

VOCAB = 8


@pytest.fixture(scope="module")
def small():
    verifier, prompt = sharp_verifier(VOCAB)
    drafter = tiny_drafter(verifier, block_size=4, conditioned=True)
    train_briefly(drafter, sampled_sequences(verifier, prompt, 64, 12), steps=40, verifier=verifier)
    return verifier, drafter, prompt, exact_first_two(verifier, prompt)


@pytest.mark.slow
@pytest.mark.parametrize("route", ["generate-K1", "generate-K4", "attach", "generate-K1-lookup", "generate-K4-lookup"])
def test_sampling_matches_target(small, route):
    verifier, drafter, prompt, exact = small
    lookup = 2 if route.endswith("lookup") else 0
    if lookup:  # a prompt that repeats tokens: the first round's tree holds a lookup draft and no drafter nodes
        prompt = torch.cat([prompt, prompt[:, 1:3]], dim=1)
        assert hf_specdiff.decoding.prompt_lookup(prompt[0], 2)
        exact = exact_first_two(verifier, prompt)
    stats = hf_specdiff.SpecDiffStats()
    torch.manual_seed(1)
    pairs = []
    if route == "attach":
        drafter.attach(verifier)
    try:
        for _ in range(SAMPLES):
            kwargs = dict(max_new_tokens=3, do_sample=True, top_k=None, eos_token_id=None)
            if route == "attach":
                out = verifier.generate(prompt, assistant_model=drafter, **kwargs)
            else:
                out = hf_specdiff.generate(verifier, drafter, prompt, num_drafts=4 if "K4" in route else 1,
                                           draft_length=2, lookup_tokens=lookup, stats=stats, **kwargs)
            pairs.append(out[0, prompt.shape[1]: prompt.shape[1] + 2])
    finally:
        drafter.detach()
    assert chi_square_pvalue(torch.stack(pairs), exact) > 1e-3
    if route != "attach":  # both accept and reject paths ran
        assert 0.2 < stats.acceptance_by_position[0] < (0.95 if route == "generate-K1" else 0.99), stats.as_dict()
