"""The text-conditioning path (spec section 7, caption pipeline) on a tiny random T5 built here, offline: the
features are the encoder's hidden states of the real tokens moved to the end, padding first and zeroed, the mask
False exactly there; long prompts are truncated; prompts are cleaned first; transformers stays out of the
default import path."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before anything imports huggingface_hub

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from coolsd.models.gpt import Caption
from coolsd.models.text import CaptionEncoder, clean_caption

ROOT = Path(__file__).resolve().parent.parent
WORDS = ["a", "photo", "of", "red", "blue", "cat", "dog", "on", "the", "grass", "in", "front", "house", "with",
         "hat", ".", ",", "end"]
SPECIALS = ["<pad>", "</s>", "<unk>"]  # T5's ids: pad 0, eos 1, unk 2


def vocab() -> dict[str, int]:
    return {token: i for i, token in enumerate(dict.fromkeys(SPECIALS + WORDS))}


def save_tokenizer(directory: Path, padding_side: str = "right") -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    table = vocab()
    tok = Tokenizer(models.WordLevel(table, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", table["</s>"])])
    wrapped = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>", unk_token="<unk>",
                                      padding_side=padding_side)
    wrapped.save_pretrained(directory)


@pytest.fixture(scope="module")
def t5_dir(tmp_path_factory) -> Path:
    from transformers import T5Config, T5EncoderModel

    directory = tmp_path_factory.mktemp("tiny_t5")
    torch.manual_seed(0)
    config = T5Config(vocab_size=len(vocab()), d_model=16, d_kv=8, d_ff=32, num_layers=1, num_heads=2,
                      pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)
    T5EncoderModel(config).eval().save_pretrained(directory)
    save_tokenizer(directory)
    return directory


@pytest.fixture(scope="module")
def encoder(t5_dir) -> CaptionEncoder:
    return CaptionEncoder(t5_dir, slots=8, device="cpu")


def direct(encoder: CaptionEncoder, words: list[str]) -> torch.Tensor:
    """The encoder's hidden states of exactly these words plus the end token, with no padding at all."""
    table = vocab()
    ids = torch.tensor([[table[w] for w in words] + [table["</s>"]]])
    with torch.no_grad():
        return encoder.model(input_ids=ids).last_hidden_state[0].float()


def check_layout(caption: Caption, expected: torch.Tensor, slots: int) -> None:
    n = len(expected)
    assert caption.features.shape == (slots, 16) and caption.features.dtype == torch.float32
    assert caption.features.device.type == "cpu"
    assert caption.valid.dtype == torch.bool and caption.valid.shape == (slots,)
    assert caption.valid.tolist() == [False] * (slots - n) + [True] * n
    assert torch.equal(caption.features[:slots - n], torch.zeros(slots - n, 16))
    torch.testing.assert_close(caption.features[slots - n:], expected, atol=1e-5, rtol=1e-5)


def test_encoder_loads_in_float32_on_cpu(encoder):
    assert encoder.model.dtype == torch.float32 and not encoder.model.training
    assert encoder.d_model == 16 and encoder.slots == 8


def test_short_and_long_prompts_match_a_direct_computation(encoder):
    short = "a red cat"
    long = "a photo of a red cat on the grass in front of the blue house"
    captions = encoder.encode([short, long])
    assert [c.text for c in captions] == [short, long]
    check_layout(captions[0], direct(encoder, short.split()), 8)  # 3 words + </s>: 4 padding slots first
    assert int(captions[0].valid.sum()) == 4
    # Truncated at 8 slots: the first 7 words and the end token, no padding.
    check_layout(captions[1], direct(encoder, long.split()[:7]), 8)
    assert bool(captions[1].valid.all())


def test_matches_llamagen_steps_on_the_padded_batch(encoder):
    """The same result as LlamaGen's sample_t2i: encode the right-padded batch with its mask, flip the mask,
    rotate each row's valid tokens to the end, multiply by the flipped mask."""
    prompts = ["a dog with a hat", "the cat", "a photo of a red cat on the grass in front of the house"]
    captions = encoder(prompts, slots=10)
    ids, mask = encoder.tokenize(prompts, slots=10)
    assert mask.tolist()[1] == [1, 1, 1] + [0] * 7 and ids.shape == (3, 10)
    with torch.no_grad():
        hidden = encoder.model(input_ids=ids, attention_mask=mask).last_hidden_state
    flipped = torch.flip(mask, dims=[-1])
    rotated = torch.stack([torch.cat([h[int(m.sum()):], h[:int(m.sum())]]) for h, m in zip(hidden, mask)])
    expected = rotated * flipped[:, :, None]
    for caption, features, valid in zip(captions, expected, flipped):
        assert torch.equal(caption.valid, valid.bool())
        torch.testing.assert_close(caption.features, features.float(), atol=1e-6, rtol=1e-6)


def test_prompts_are_cleaned_and_rows_are_independent(encoder):
    plain, noisy = encoder.encode(["a red cat", "  A RED <b>Cat</b> https://example.com/x "])
    assert torch.equal(plain.features, noisy.features) and torch.equal(plain.valid, noisy.valid)
    alone = encoder.encode(["a red cat"])[0]
    torch.testing.assert_close(alone.features, plain.features, atol=1e-6, rtol=1e-6)
    assert encoder.encode([]) == []
    with pytest.raises(TypeError, match="list of prompts"):
        encoder.encode("a red cat")
    unknown = encoder.encode(["zebra"], slots=4)[0]  # an out-of-vocabulary word still counts as a token
    assert unknown.valid.tolist() == [False, False, True, True]


def test_left_padding_tokenizer_is_padded_on_the_right(t5_dir, tmp_path):
    import shutil
    directory = tmp_path / "left"
    shutil.copytree(t5_dir, directory)
    save_tokenizer(directory, padding_side="left")
    left = CaptionEncoder(directory, slots=8, device="cpu")
    check_layout(left.encode(["a red cat"])[0], direct(left, ["a", "red", "cat"]), 8)


def test_missing_directory_and_offline_hub_miss_are_clear(t5_dir, tmp_path, monkeypatch):
    missing = tmp_path / "no" / "t5"
    with pytest.raises(ValueError, match=str(missing)):
        CaptionEncoder(missing, device="cpu")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(OSError, match="HF_HUB_OFFLINE") as caught:
        CaptionEncoder("coolsd-test-nobody/no-such-t5-encoder", device="cpu")
    assert "coolsd-test-nobody/no-such-t5-encoder" in str(caught.value)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match=f"{empty} has no config.json"):
        CaptionEncoder(empty, device="cpu")
    (empty / "config.json").write_text((t5_dir / "config.json").read_text())  # no weights, no tokenizer
    with pytest.raises((OSError, ValueError), match=f"from the directory {empty}"):
        CaptionEncoder(empty, device="cpu")
    with pytest.raises(ValueError, match="slots"):
        CaptionEncoder(empty, slots=0, device="cpu")


# Expected values checked against LlamaGen's own cleaning (with ftfy and bs4) outside this project.
@pytest.mark.parametrize("raw, cleaned", [
    ("A photo of a Cat.", "a photo of a cat."),
    ("  A Blue Porsche 356 parked in front of a yellow brick wall.  ",
     ("a blue porsche 356 parked in front of a yellow brick wall.")),
    ("a cat https://example.com/cat and www.foo.org", "a cat and"),
    ("<p>A <b>red</b> apple</p>", "a red apple"),
    ("Tom &amp; Jerry", "tom jerry"),
    ("“Quoted” text", '"quoted" text'),
    ("a dog,running", "a dog, running"),
    ("hello @someone world", "hello world"),
    ("a\u2014b", "a-b"),
    ("this-is-my-cute-cat", "this is my cute cat"),
    ("image 1920x1080 wallpaper", "image wallpaper"),
    ("a cat 猫 sitting", "a cat sitting"),
    ("café ﬁsh", "café fish"),
    ("a+b%20c", "a b c"),
    ("FREE SHIPPING red shoes", "red shoes"),
    ("x < y", "x < y"),
])
def test_clean_caption(raw, cleaned):
    assert clean_caption(raw) == cleaned


def test_default_imports_do_not_import_transformers():
    code = ("import sys, coolsd, coolsd.models.gpt, coolsd.models.text\n"
            "bad = sorted(m for m in ('transformers', 'tokenizers') if m in sys.modules)\n"
            "assert not bad, bad\n")
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", code], check=False, cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
