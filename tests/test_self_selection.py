"""SpecDiff-2 self-selection: K drafts verified as one prefix tree, exact for greedy and sampling."""

import copy

import pytest
import torch
from transformers import StopStringCriteria

import hf_specdiff
import hf_specdiff.decoding as decoding
from helpers import (ARCHS, CollectingStreamer, greedy_sequences, sampled_sequences, sharp_verifier, tiny_drafter,
                     tiny_gemma3, tiny_tokenizer, tiny_verifier, train_briefly)
from stats import chi_square_pvalue, exact_first_two

PROMPTS = torch.randint(3, 96, (12, 6), generator=torch.Generator().manual_seed(2))
VERIFIERS = {**{arch: (lambda arch=arch: tiny_verifier(arch)) for arch in ARCHS}, "gemma3": tiny_gemma3}


@pytest.fixture(scope="module")
def trained():
    cache = {}

    def get(arch):
        if arch not in cache:
            verifier = VERIFIERS[arch]()
            drafter = tiny_drafter(verifier, block_size=16)
            train_briefly(drafter, greedy_sequences(verifier, PROMPTS, 48), steps=120)
            cache[arch] = verifier, drafter
        return cache[arch]

    return get


@pytest.mark.parametrize("arch", list(VERIFIERS))
@pytest.mark.parametrize("num_drafts", [1, 2, 8])
@pytest.mark.parametrize("draft_length", [1, 4, 16])
def test_greedy_equals_plain(trained, arch, num_drafts, draft_length):
    verifier, drafter = trained(arch)
    for i, prompt in enumerate(PROMPTS[:2].split(1)):
        plain = verifier.generate(prompt, max_new_tokens=40, do_sample=False, eos_token_id=None)
        out = hf_specdiff.generate(verifier, drafter, prompt, max_new_tokens=40, do_sample=False, eos_token_id=None,
                                   num_drafts=num_drafts, draft_length=draft_length)
        assert out.tolist() == plain.tolist()
        eos = int(plain[0, prompt.shape[1] + 12 + i])
        plain = verifier.generate(prompt, max_new_tokens=40, do_sample=False, eos_token_id=eos)
        out = hf_specdiff.generate(verifier, drafter, prompt, max_new_tokens=40, do_sample=False, eos_token_id=eos,
                                   num_drafts=num_drafts, draft_length=draft_length)
        assert plain[0, -1] == eos and out.tolist() == plain.tolist()


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("num_drafts", [1, 8])
def test_stop_strings_and_custom_generate_callable(trained, arch, num_drafts):
    verifier, drafter = trained(arch)
    tokenizer = tiny_tokenizer()
    prompt = PROMPTS[:1]
    plain = verifier.generate(prompt, max_new_tokens=40, do_sample=False, eos_token_id=None)
    stop = tokenizer.decode(plain[0, prompt.shape[1] + 14: prompt.shape[1] + 16])
    kwargs = dict(max_new_tokens=40, do_sample=False, eos_token_id=None, stop_strings=[stop], tokenizer=tokenizer)
    plain = verifier.generate(prompt, **kwargs)
    assert plain.shape[1] < prompt.shape[1] + 40
    out = hf_specdiff.generate(verifier, drafter, prompt, num_drafts=num_drafts, **kwargs)
    assert out.tolist() == plain.tolist()
    del kwargs["stop_strings"], kwargs["tokenizer"]  # transformers drops the tokenizer on the callable route
    out = verifier.generate(prompt, custom_generate=hf_specdiff.specdiff_generate, drafter=drafter,
                            num_drafts=num_drafts, stopping_criteria=[StopStringCriteria(tokenizer, [stop])], **kwargs)
    assert out.tolist() == plain.tolist()


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_compacted_cache_equals_fresh_cache(trained, arch):
    verifier, drafter = trained(arch)  # gemma3: sliding window 8, shorter than the context
    stats = hf_specdiff.SpecDiffStats()
    out = hf_specdiff.generate(verifier, drafter, PROMPTS[:1], max_new_tokens=40, do_sample=False, eos_token_id=None,
                               num_drafts=8, draft_length=8, return_dict_in_generate=True, stats=stats)
    assert stats.rounds < 40  # drafts were accepted, so the cache was compacted past rejected nodes
    sequence, cache = out.sequences, copy.deepcopy(out.past_key_values)
    assert cache.get_seq_length() == sequence.shape[1] - 1
    with torch.no_grad():
        cached = verifier(sequence[:, -1:], past_key_values=cache).logits[0, -1]
        fresh = verifier(sequence).logits[0, -1]
    torch.testing.assert_close(cached, fresh, rtol=1e-5, atol=1e-5)


def test_self_selection_raises_tau_and_reports_it(trained):
    verifier, drafter = trained("llama")
    taus = {}
    for num_drafts in (1, 8):
        stats = hf_specdiff.SpecDiffStats()
        for prompt in PROMPTS[:6].split(1):
            hf_specdiff.generate(verifier, drafter, prompt, max_new_tokens=40, do_sample=False, eos_token_id=None,
                                 num_drafts=num_drafts, draft_length=8, stats=stats)
        assert stats.new_tokens == 6 * 40 and drafter.last_stats is stats
        assert len(stats.acceptance_by_position) == 8
        taus[num_drafts] = stats.tau
    assert taus[8] > taus[1] > 1.0, taus


def test_streamer_scores_and_dict_output(trained):
    verifier, drafter = trained("qwen2")
    streamer = CollectingStreamer()
    out = hf_specdiff.generate(verifier, drafter, PROMPTS[:1], max_new_tokens=30, do_sample=False,
                               eos_token_id=None, num_drafts=4, streamer=streamer, return_dict_in_generate=True,
                               output_scores=True)
    new = out.sequences[0, PROMPTS.shape[1]:].tolist()
    assert streamer.tokens == new and streamer.ended
    assert len(out.scores) == 30
    assert [int(s.argmax()) for s in out.scores] == new  # greedy: each token is the argmax of its scores


def test_custom_generate_folder_matches_callable(trained, tmp_path):
    verifier, drafter = trained("llama")
    folder = hf_specdiff.export_custom_generate(tmp_path / "specdiff-generate")
    kwargs = dict(max_new_tokens=30, do_sample=False, eos_token_id=None, drafter=drafter, num_drafts=4)
    expected = verifier.generate(PROMPTS[:1], custom_generate=hf_specdiff.specdiff_generate, **kwargs)
    got = verifier.generate(PROMPTS[:1], custom_generate=str(folder), trust_remote_code=True, **kwargs)
    assert got.tolist() == expected.tolist()


def test_errors(trained):
    verifier, drafter = trained("llama")
    with pytest.raises(ValueError, match="needs a drafter"):
        verifier.generate(PROMPTS[:1], custom_generate=hf_specdiff.specdiff_generate, max_new_tokens=4)
    with pytest.raises(ValueError, match="one prompt at a time"):
        hf_specdiff.generate(verifier, drafter, PROMPTS[:2], attention_mask=torch.ones_like(PROMPTS[:2]),
                             max_new_tokens=4, num_drafts=2)
    with pytest.raises(ValueError, match="draft_length must be between 1 and the drafter's block_size"):
        hf_specdiff.generate(verifier, drafter, PROMPTS[:1], max_new_tokens=4, draft_length=17)
    other = tiny_drafter(tiny_verifier("llama", vocab_size=128))
    with pytest.raises(ValueError, match="vocab_size \\(128\\) differs"):
        hf_specdiff.generate(verifier, other, PROMPTS[:1], max_new_tokens=4, num_drafts=2)
    flash = copy.deepcopy(verifier)
    flash.config._attn_implementation = "flash_attention_2"
    with pytest.raises(ValueError, match="attn_implementation='sdpa'"):
        hf_specdiff.generate(flash, drafter, PROMPTS[:1], max_new_tokens=4, num_drafts=2)


# ---- sampling ------------------------------------------------------------------------------------------------

VOCAB, SAMPLES = 8, 1200


@pytest.fixture(scope="module")
def small():
    verifier, prompt = sharp_verifier(VOCAB)
    # Close to the target but not equal: drafts are accepted about half the time, so both paths run.
    drafter = train_briefly(tiny_drafter(verifier, block_size=4), sampled_sequences(verifier, prompt, 64, 12), steps=40)
    return verifier, drafter, prompt, exact_first_two(verifier, prompt)


def sample_pairs(verifier, drafter, prompt, num_drafts, stats=None):
    torch.manual_seed(1)
    pairs = []
    for _ in range(SAMPLES):
        out = hf_specdiff.generate(verifier, drafter, prompt, max_new_tokens=3, do_sample=True, top_k=None,
                                   eos_token_id=None, num_drafts=num_drafts, draft_length=2, stats=stats)
        pairs.append(out[0, prompt.shape[1]: prompt.shape[1] + 2])
    return torch.stack(pairs)


@pytest.mark.parametrize("num_drafts", [1, 4])
def test_sampling_matches_target(small, num_drafts):
    verifier, drafter, prompt, exact = small
    stats = hf_specdiff.SpecDiffStats()
    assert chi_square_pvalue(sample_pairs(verifier, drafter, prompt, num_drafts, stats), exact) > 1e-3
    assert 0.2 < stats.acceptance_by_position[0] < 0.95  # both accept and reject paths ran


def test_chi_square_catches_a_wrong_acceptance_rule(small, monkeypatch):
    verifier, drafter, prompt, exact = small
    monkeypatch.setattr(decoding, "residual", lambda p, q: p)  # wrong: keep the target after a rejection
    assert chi_square_pvalue(sample_pairs(verifier, drafter, prompt, 4), exact) < 1e-3


def test_committed_custom_generate_folder_is_current():
    from pathlib import Path

    folder = Path(__file__).resolve().parents[1] / "model_cards" / "specdiff-generate"
    assert (folder / "custom_generate" / "generate.py").read_text() == Path(decoding.__file__).read_text(), \
        "regenerate with: python -c \"import hf_specdiff; hf_specdiff.export_custom_generate('model_cards/specdiff-generate')\""
    assert (folder / "README.md").read_text() == hf_specdiff.hub.CUSTOM_GENERATE_README


def test_draft_length_adapts_to_measured_acceptance():
    controller = decoding.DraftLengthController(max_length=16)
    assert controller.next_length() == 16  # optimistic start: untried positions count as accepted
    for _ in range(20):
        controller.update(num_drafted=controller.next_length(), num_accepted=1)  # always rejected at position 2
    assert controller.next_length() <= 3
    for _ in range(60):
        length = controller.next_length()
        controller.update(num_drafted=length, num_accepted=length)  # now everything is accepted
    assert controller.next_length() == 16
    assert decoding.DraftLengthController(max_length=16, fixed=5).next_length() == 5
