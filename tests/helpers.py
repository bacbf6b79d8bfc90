"""Tiny random verifiers and briefly trained drafters, built in-process (no hub)."""

import functools
import subprocess
import sys
import textwrap

import torch
from transformers import (GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM,
                          Qwen3Config, Qwen3ForCausalLM)

from hf_specdiff import SpecDiffDrafter
from hf_specdiff.training.block_diffusion import block_logits, make_block_diffusion_batch
from hf_specdiff.compat import drafter_config_for
from hf_specdiff.training.objectives import ce_streak_loss
from hf_specdiff.training.trainer import verifier_features

SPECIAL = dict(bos_token_id=1, eos_token_id=2, pad_token_id=0)
ARCHS = ("llama", "qwen2", "gpt2")


def tiny_verifier(arch: str = "llama", vocab_size: int = 96, seed: int = 0, dtype=torch.float32):
    torch.manual_seed(seed)
    if arch == "llama":
        config = LlamaConfig(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, **SPECIAL)
        model = LlamaForCausalLM(config)
    elif arch == "qwen2":
        config = Qwen2Config(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, **SPECIAL)
        model = Qwen2ForCausalLM(config)
    elif arch == "qwen3":
        config = Qwen3Config(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                             num_attention_heads=4, num_key_value_heads=2, head_dim=16, **SPECIAL)
        model = Qwen3ForCausalLM(config)
    elif arch == "gpt2":
        config = GPT2Config(vocab_size=vocab_size, n_embd=64, n_layer=2, n_head=4, n_positions=512, **SPECIAL)
        model = GPT2LMHeadModel(config)
    else:
        raise ValueError(arch)
    return model.to(dtype).eval()


def sharp_verifier(vocab_size: int = 8, seed: int = 3):
    """A tiny verifier over a small vocabulary whose head is sharpened, so its distribution is far from uniform
    (the setting of the chi-square tests), and the prompt they sample after."""
    verifier = tiny_verifier("llama", vocab_size=vocab_size, seed=seed)
    with torch.no_grad():
        verifier.lm_head.weight.mul_(20)
    return verifier, torch.tensor([[3, 5, 4, 7]])


def tiny_drafter(verifier, block_size: int = 8, num_denoising_steps: int = 1, **kwargs):
    sizes = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2)
    config = drafter_config_for(verifier, block_size=block_size, num_denoising_steps=num_denoising_steps,
                                **{**sizes, **kwargs})
    return SpecDiffDrafter(config).eval()


def tiny_dflash_drafter(verifier, block_size: int = 8, **kwargs):
    """A drafter of the dflash layout (the verifier's width, embeddings and head; mask token 3), given the verifier."""
    text = verifier.config.get_text_config()
    sizes = dict(hidden_size=text.hidden_size, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                 head_dim=16)
    config = drafter_config_for(verifier, conditioned=True, layout="dflash", mask_token_id=3, block_size=block_size,
                                **{**sizes, **kwargs})
    return SpecDiffDrafter(config).eval().set_verifier(verifier)


@functools.cache
def trained_dflash(arch: str):
    """(verifier, dflash-layout drafter trained briefly on its greedy continuations of DFLASH_PROMPTS), built once per
    test session and shared by the tests that only read them."""
    verifier = tiny_verifier(arch)
    drafter = tiny_dflash_drafter(verifier)
    train_briefly(drafter, greedy_sequences(verifier, DFLASH_PROMPTS, 40), steps=120, verifier=verifier)
    return verifier, drafter


DFLASH_PROMPTS = torch.randint(4, 96, (12, 6), generator=torch.Generator().manual_seed(7))
PROMPTS = torch.randint(3, 96, (12, 6), generator=torch.Generator().manual_seed(2))


def any_verifier(arch: str):
    """A tiny verifier of `arch`: one of ARCHS, "qwen3", or "gemma3" (sliding-window layers)."""
    return tiny_gemma3() if arch == "gemma3" else tiny_verifier(arch)


@functools.cache
def trained_standalone(arch: str):
    """(verifier, standalone drafter with block 16 trained briefly on its greedy continuations of PROMPTS), built
    once per test session and shared by the tests that only read them."""
    verifier = any_verifier(arch)
    drafter = tiny_drafter(verifier, block_size=16)
    train_briefly(drafter, greedy_sequences(verifier, PROMPTS, 48), steps=150)
    return verifier, drafter


def greedy_sequences(verifier, prompts: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
    with torch.no_grad():
        return verifier.generate(prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=max_new_tokens,
                                 do_sample=False, eos_token_id=None)


def sampled_sequences(verifier, prompt: torch.Tensor, num: int, max_new_tokens: int, seed: int = 0) -> torch.Tensor:
    """`num` samples [num, L] from `verifier` after `prompt` [1, L0] (temperature 1, no top-k)."""
    torch.manual_seed(seed)
    prompts = prompt.expand(num, -1)
    with torch.no_grad():
        return verifier.generate(prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=max_new_tokens,
                                 do_sample=True, top_k=None, eos_token_id=None)


def train_briefly(drafter, sequences: torch.Tensor, steps: int = 150, lr: float = 3e-3, noise: str = "full",
                  verifier=None):
    """A few hundred steps of streak-weighted cross-entropy on `sequences` [n, L] (a conditioned drafter also
    needs the `verifier`, whose features it reads)."""
    features = None
    if drafter.config.is_conditioned:
        features = verifier_features(verifier, drafter, sequences, torch.ones_like(sequences, dtype=torch.bool))
    drafter.train()
    opt = torch.optim.AdamW(drafter.parameters(), lr=lr)
    generator = torch.Generator().manual_seed(0)
    for _ in range(steps):
        batch = make_block_diffusion_batch(sequences, drafter.config.max_draft_tokens, drafter.config.mask_token_index,
                                           noise, generator, drafter.config.is_conditioned)
        loss = ce_streak_loss(block_logits(drafter, batch, features), drafter.to_draft_vocab(batch.targets))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return drafter.eval()


class ForwardCounter:
    """Counts a model's forward calls."""

    def __init__(self, model):
        self.count = 0
        self._handle = model.register_forward_pre_hook(self._hook)

    def _hook(self, *_):
        self.count += 1

    def remove(self):
        self._handle.remove()


def tiny_tokenizer(vocab_size: int = 96):
    """A word-level tokenizer over words t4..t{V-1} plus <pad>=0, <s>=1, </s>=2, with a decoder joining by spaces.

    Id 3 is "abcdef", the probe that transformers' stop-string matching tokenizes to learn token boundaries."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "abcdef": 3, **{f"t{i}": i for i in range(4, vocab_size)}}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.decoder = decoders.WordPiece(prefix="##")
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    return tokenizer


def tiny_gemma3(vocab_size: int = 96, sliding_window: int = 8, seed: int = 0):
    """A tiny Gemma-3 text model whose sliding-window layers see only `sliding_window` tokens."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(seed)
    config = Gemma3TextConfig(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                              num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                              sliding_window=sliding_window, sliding_window_pattern=2,
                              layer_types=["sliding_attention", "full_attention"] * 2,
                              attn_implementation="sdpa", **SPECIAL)
    return Gemma3ForCausalLM(config).eval()


class CollectingStreamer:
    """A streamer that keeps what it is given: like transformers' streamers, it takes the first put as the prompt."""

    def __init__(self):
        self.prompt, self.tokens, self.ended = None, [], False

    def put(self, value):
        if self.prompt is None:
            self.prompt = value.flatten().tolist()
        else:
            self.tokens += value.flatten().tolist()

    def end(self):
        self.ended = True


def run_as_remote_code(folder, verifier, drafter, body: str):
    """Save `verifier` and `drafter` in `folder` and run `body` in a fresh Python that cannot import hf_specdiff, with
    `torch`, `verifier` and `drafter` (loaded with trust_remote_code, as a Hub user gets it) in scope."""
    verifier.save_pretrained(folder / "verifier")
    drafter.save_pretrained(folder / "drafter")
    script = textwrap.dedent(f"""
        import sys, torch
        sys.modules["hf_specdiff"] = None  # the package must not be importable
        from transformers import AutoModelForCausalLM
        verifier = AutoModelForCausalLM.from_pretrained({str(folder / "verifier")!r}).eval()
        drafter = AutoModelForCausalLM.from_pretrained({str(folder / "drafter")!r}, trust_remote_code=True).eval()
    """) + textwrap.dedent(body)
    subprocess.run([sys.executable, "-c", script], check=True, cwd=folder)
