"""Self-synthesised prompts: the user-turn prefix, the request filter, a resumable run without duplicates."""

import json

import pytest

from hf_specdiff.training.data import read_prompts
from hf_specdiff.training.magpie import is_request, normalize, synthesize_prompts, user_turn
from helpers import tiny_tokenizer, tiny_verifier


def chat_tokenizer():
    tokenizer = tiny_tokenizer()
    tokenizer.chat_template = "<s> {% for m in messages %}t4 {{ m['content'] }} </s> {% endfor %}"
    return tokenizer


def test_user_turn_is_the_template_up_to_the_message():
    assert user_turn(chat_tokenizer()) == ([1, 4], {2})
    with pytest.raises(ValueError, match="nothing before the user's message"):
        user_turn(tiny_tokenizer())


def test_request_filter_and_normalized_duplicates():
    assert is_request("Can you tell me the main ingredients of a chocolate cake?")
    assert is_request("Write a short poem about the sea.")
    assert not is_request("The sea.")  # too short
    assert not is_request("the " * 30 + "end?")  # repetitive
    assert not is_request("Blue whales are the largest animals that ever lived on earth.")  # not asking
    assert normalize("Hello,  World!") == normalize("hello world")


def test_synthesis_resumes_and_never_repeats(tmp_path):
    verifier, tokenizer = tiny_verifier("llama"), chat_tokenizer()
    out = tmp_path / "prompts.jsonl"
    run = dict(batch_size=8, max_new_tokens=6, keep=lambda text: True, progress=False)
    synthesize_prompts(verifier, tokenizer, 5, out, **run)
    first = out.read_text().splitlines()
    assert len(first) == 5
    synthesize_prompts(verifier, tokenizer, 12, out, **run)  # a later run with a larger target extends the file
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert out.read_text().splitlines()[:5] == first and len(rows) == 12
    assert len({normalize(r["prompt"]) for r in rows}) == 12 and {r["source"] for r in rows} == {"magpie"}
    assert len(read_prompts(out)) == 12
    meta = json.loads(out.with_suffix(".meta.json").read_text())
    assert meta["kept"] == 12 and meta["turns"] == 8 * meta["batches"]
    assert 8 * meta["batches"] <= meta["generated_tokens"] <= 6 * 8 * meta["batches"] and meta["tok_s"] > 0
    with pytest.raises(ValueError, match="other settings"):
        synthesize_prompts(verifier, tokenizer, 20, out, **{**run, "max_new_tokens": 7})
