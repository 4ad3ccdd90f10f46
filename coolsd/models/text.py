"""Text conditioning for LlamaGen-style text-to-image models (spec section 7, caption pipeline): a prompt is
cleaned (:func:`clean_caption`), tokenised to ``slots`` tokens, run through a T5 encoder, and laid out as
LlamaGen's sampler lays it out (real tokens at the end, padding first and zeroed) in a
:class:`~coolsd.models.gpt.Caption`.

``transformers`` is imported only inside :class:`CaptionEncoder`, so the class-conditional models, and
``import coolsd``, never import it.
"""

from __future__ import annotations

import html
import os
import re
import unicodedata
import urllib.parse
from html.parser import HTMLParser
from pathlib import Path

import torch

from ..core.params import number, shorten
from .gpt import Caption

# ---------------------------------------------------------------------------------------------------------------
# Caption cleaning
#
# LlamaGen's T5 wrapper (``language/t5.py``, itself taken from PixArt / DeepFloyd IF) cleans every prompt twice
# before tokenising. The steps below reproduce its sequence of regular expressions in the same order; the two
# third-party calls it makes are replaced by standard-library equivalents:
#
# * ``BeautifulSoup(text, "html.parser").text`` -> :func:`_strip_html`, the same standard-library HTML parser
#   that bs4's ``html.parser`` builder drives, keeping text and dropping tags, comments and the contents of
#   <script>/<style>/<template> (as bs4's ``get_text`` does).
# * ``ftfy.fix_text`` -> :func:`_fix_text`: NFC normalisation, Latin ligatures and half- and full-width
#   forms to ordinary characters, curly quotes to straight ones, line breaks unified, control characters removed.
#   Left out: ftfy's mojibake repair (text decoded with the wrong codec, e.g. "cafÃ©" -> "café"), surrogate
#   repair, terminal escape sequences, and its HTML-entity unescaping (the wrapper unescapes twice right
#   after it anyway). None of these change a plainly typed prompt; on 3,100 test strings (typed prompts,
#   HTML, URLs, entities, symbols, random mixtures) the result equals the original's with ftfy and bs4.
# ---------------------------------------------------------------------------------------------------------------

_URL_TAIL = r"[a-zA-Z0-9.\-]+[.](?:com|co|ru|net|org|edu|gov|it)[\w/-]*\b\/?(?!@)"
_MEDIA = r"(?:png|jpg|jpeg|bmp|webp|eps|pdf|apk|mp4)"
# Runs of these characters become one space: # ® • © ™ & @ · º ½ ¾ ¿ ¡ § ~ ) ( ] [ } { | \ / *
_BAD_PUNCT = r"[#®•©™&@·º½¾¿¡§~)(\]\[}{|\\/*]+"
_DASHES = (r"[\u002D\u058A\u05BE\u1400\u1806\u2010-\u2015\u2E17\u2E1A\u2E3A\u2E3B\u2E40\u301C\u3030\u30A0"
           r"\uFE31\uFE32\uFE58\uFE63\uFF0D]+")


def _steps(*pairs: tuple[str, str]) -> list[tuple[re.Pattern, str]]:
    return [(re.compile(pattern), replacement) for pattern, replacement in pairs]


# Before the HTML is stripped.
_BEFORE_HTML = _steps(
    (r"<person>", "person"),
    (r"\b((?:https?:(?:\/{1,3}|[a-zA-Z0-9%])|" + _URL_TAIL + r"))", ""),  # URLs
    (r"\b((?:www:(?:\/{1,3}|[a-zA-Z0-9%])|" + _URL_TAIL + r"))", ""),
)

# Between the HTML stripping and the ftfy-style repair.
_MIDDLE = _steps(
    (r"@[\w\d]+\b", ""),  # @nickname
    # CJK strokes, katakana extensions, enclosed CJK, CJK compatibility, CJK ideographs, Yijing hexagrams
    (r"[\u31c0-\u31ef]+", ""), (r"[\u31f0-\u31ff]+", ""), (r"[\u3200-\u32ff]+", ""), (r"[\u3300-\u33ff]+", ""),
    (r"[\u3400-\u4dbf]+", ""), (r"[\u4dc0-\u4dff]+", ""), (r"[\u4e00-\u9fff]+", ""),
    (_DASHES, "-"),  # every kind of dash
    (r"[`´«»“”¨]", '"'), (r"[‘’]", "'"),  # quotes
    (r"&quot;?", ""), (r"&amp", ""),
    (r"\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}", " "),  # IP addresses
    (r"\d:\d\d\s+$", ""),  # article ids
    (r"\\n", " "),  # a literal backslash-n
    (r"#\d{1,3}\b", ""), (r"#\d{5,}\b", ""), (r"\b\d{6,}\b", ""),  # #123, #12345..., 123456...
    (r"[\S]+\." + _MEDIA, ""),  # file names
    (r"[\"\']{2,}", '"'), (r"[\.]{2,}", " "),
    (_BAD_PUNCT, " "),
    (r"\s+\.\s+", " "),
)

_SEPARATORS = re.compile(r"(?:\-|\_)")  # this-is-my-cute-cat / this_is_my_cute_cat, when there are over three

# After the ftfy-style repair.
_AFTER = _steps(
    (r"\b[a-zA-Z]{1,3}\d{3,15}\b", ""),  # jc6640
    (r"\b[a-zA-Z]+\d+[a-zA-Z]+\b", ""),  # jc6640vc
    (r"\b\d+[a-zA-Z]+\d+\b", ""),  # 6640vc231
    (r"(worldwide\s+)?(free\s+)?shipping", ""),
    (r"(free\s)?download(\sfree)?", ""),
    (r"\bclick\b\s(?:for|on)\s\w+", ""),
    (r"\b" + _MEDIA + r"(\simage[s]?)?", ""),
    (r"\bpage\s+\d+\b", ""),
    (r"\b\d*[a-zA-Z]+\d+[a-zA-Z]+\d+[a-zA-Z\d]*\b", " "),  # j2d1a2a...
    (r"\b\d+\.?\d*[xх×]\d+\.?\d*\b", ""),  # 1920x1080
    (r"\b\s+\:\s+", ": "),
    (r"(\D[,\./])\b", r"\1 "),  # a space after punctuation glued to the next word
    (r"\s+", " "),
    (r"^[\"\']([\w\W]+)[\"\']$", r"\1"),  # surrounding quotes
    (r"^[\'\_,\-\:;]", ""),
    (r"[\'\_,\-\:\-\+]$", ""),
    (r"^\.\S+$", ""),
)

_LIGATURES = {chr(c): unicodedata.normalize("NFKC", chr(c))
              for c in [0x132, 0x133, 0x149, *range(0x1C4, 0x1CD), *range(0xFB00, 0xFB07)]}
_WIDE = {chr(c): unicodedata.normalize("NFKC", chr(c)) for c in range(0xFF01, 0xFFF0)} | {"\u3000": " "}  # forms
_CURLY = {c: "'" for c in "\u02bc\u2018\u2019\u201a\u201b"} | {c: '"' for c in "\u201c\u201d\u201e\u201f"}
_REPAIR = str.maketrans(_LIGATURES | _WIDE | _CURLY)
_LINE_BREAKS = re.compile(r"\r\n|[\r\u2028\u2029\x85]")
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0e-\x1f\x7f\u206a-\u206f\ufeff\ufff9-\ufffc]")


def _fix_text(text: str) -> str:
    """The parts of ``ftfy.fix_text`` that matter for typed prompts (see the note at the top of this module)."""
    text = _LINE_BREAKS.sub("\n", _CONTROL.sub("", text.translate(_REPAIR)))
    return unicodedata.normalize("NFC", text)


class _TextOnly(HTMLParser):
    """Collects the text of an HTML fragment, leaving out tags, comments and script/style/template bodies."""

    HIDDEN = frozenset({"script", "style", "template"})

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.hidden = 0

    def handle_starttag(self, tag, attrs) -> None:
        self.hidden += tag in self.HIDDEN

    def handle_endtag(self, tag) -> None:
        if tag in self.HIDDEN and self.hidden:
            self.hidden -= 1

    def handle_data(self, data) -> None:
        if not self.hidden:
            self.parts.append(data)


def _strip_html(text: str) -> str:
    parser = _TextOnly()
    parser.feed(text)
    parser.close()
    return "".join(parser.parts)


def _clean_once(caption: str) -> str:
    caption = urllib.parse.unquote_plus(str(caption)).strip().lower()
    for pattern, replacement in _BEFORE_HTML:
        caption = pattern.sub(replacement, caption)
    caption = _strip_html(caption)
    for pattern, replacement in _MIDDLE:
        caption = pattern.sub(replacement, caption)
    if len(_SEPARATORS.findall(caption)) > 3:
        caption = _SEPARATORS.sub(" ", caption)
    caption = html.unescape(html.unescape(_fix_text(caption))).strip()
    for pattern, replacement in _AFTER:
        caption = pattern.sub(replacement, caption)
    return caption.strip()


def clean_caption(text: str) -> str:
    """A prompt as LlamaGen's T5 wrapper hands it to the tokenizer: its cleaning applied twice (as the wrapper
    does). Lower-cases and strips; decodes %-escapes and ``+``; removes URLs, HTML tags and entities,
    @nicknames, CJK ideographs, IP addresses, file names, long numbers and product codes, shop phrases
    ("free shipping", "click for ..."); unifies dashes and quotes; replaces stray symbols (# & @ * / | brackets
    ...) by spaces; collapses whitespace. Plain English prompts usually come back lower-cased and otherwise
    unchanged, e.g. ``"A photo of a Cat."`` -> ``"a photo of a cat."``."""
    return _clean_once(_clean_once(text))


# ---------------------------------------------------------------------------------------------------------------
# The encoder
# ---------------------------------------------------------------------------------------------------------------

def _offline() -> bool:
    """Whether ``HF_HUB_OFFLINE`` is set, read now (huggingface_hub reads it once, at import)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "on", "yes", "true"}


def _looks_like_hub_id(path: str) -> bool:
    """``name`` or ``owner/name`` as the Hugging Face hub spells repositories (not a relative or absolute path)."""
    return re.fullmatch(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?", path) is not None and ".." not in path


class CaptionEncoder:
    """Prompts -> :class:`~coolsd.models.gpt.Caption` conditions through a T5 encoder (LlamaGen: FLAN-T5-XL,
    120 slots of 2048-d features).

    ``path`` is a local directory holding the encoder (``config.json`` + weights) and its tokenizer, or a hub id
    (``google/flan-t5-xl``) already in the local Hugging Face cache or, unless ``HF_HUB_OFFLINE`` is set,
    downloadable. The encoder runs on ``device`` (default: CUDA if present) in ``dtype`` (default: bfloat16 on
    CUDA, as LlamaGen samples, float32 elsewhere); the features it returns are float32 on the CPU.
    ``clean=False`` only lower-cases and strips prompts (LlamaGen's ``use_text_preprocessing=False``).
    Calling the encoder is :meth:`encode`.
    """

    def __init__(self, path: str | Path, *, slots: int = 120, device: str | torch.device | None = None,
                 dtype: torch.dtype | None = None, clean: bool = True, batch_size: int = 16) -> None:
        self.path = str(path)
        self.slots = number("slots", slots, 1, integer=True)
        self.batch_size = number("batch_size", batch_size, 1, integer=True)
        self.device = torch.device(device) if device is not None else \
            torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.dtype = dtype or (torch.bfloat16 if self.device.type == "cuda" else torch.float32)
        self.clean = clean
        self.tokenizer, self.model = _load_t5(self.path, self.device, self.dtype)

    @property
    def d_model(self) -> int:
        """The feature width (a text model's ``caption_dim``)."""
        return int(self.model.config.d_model)

    def prepare(self, prompt: str) -> str:
        """The text the tokenizer sees."""
        return clean_caption(prompt) if self.clean else str(prompt).lower().strip()

    def tokenize(self, prompts: list[str], slots: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Token ids and attention mask (B, slots): the end-of-sequence token appended, padded on the right,
        longer prompts truncated on the right (the end-of-sequence token kept)."""
        slots = self.slots if slots is None else number("slots", slots, 1, integer=True)
        batch = self.tokenizer([self.prepare(prompt) for prompt in prompts], max_length=slots, padding="max_length",
                               truncation=True, add_special_tokens=True, return_attention_mask=True,
                               return_tensors="pt")
        return batch["input_ids"], batch["attention_mask"]

    @torch.no_grad()
    def encode(self, prompts: list[str], slots: int | None = None) -> list[Caption]:
        """One Caption per prompt: features (slots, d_model) float32 on the CPU, and valid (slots,) bool.

        As LlamaGen's sampler: the encoder's last hidden state of the right-padded tokens; each row's ``n``
        real tokens moved to the end (padding first), the mask flipped to match, padded features zeroed."""
        if isinstance(prompts, str):
            raise TypeError(f"encode takes a list of prompts, got the string {shorten(prompts)}")
        prompts = list(prompts)
        captions: list[Caption] = []
        for start in range(0, len(prompts), self.batch_size):
            chunk = prompts[start:start + self.batch_size]
            ids, mask = self.tokenize(chunk, slots)
            hidden = self.model(input_ids=ids.to(self.device), attention_mask=mask.to(self.device)).last_hidden_state
            hidden = hidden.float().cpu()
            for prompt, row, row_mask in zip(chunk, hidden, mask):
                if not bool((row_mask[:-1] >= row_mask[1:]).all()):  # padding must be on the right
                    raise RuntimeError(f"tokenizer of {self.path} did not pad {shorten(prompt)} on the right")
                n = int(row_mask.sum())
                valid = torch.flip(row_mask, dims=[0]).bool()
                features = torch.where(valid[:, None], torch.cat([row[n:], row[:n]]), 0.0)
                captions.append(Caption(features.contiguous(), valid, str(prompt)))
        return captions

    __call__ = encode

    def __repr__(self) -> str:
        return f"CaptionEncoder({self.path!r}, slots={self.slots}, d_model={self.d_model}, device={self.device})"


def _load_t5(path: str, device: torch.device, dtype: torch.dtype):
    """(tokenizer, T5EncoderModel in eval mode on ``device``) from a directory or hub id; clear errors when the
    directory is missing or the hub cannot be reached."""
    local = Path(path).expanduser()
    if local.is_file():
        raise ValueError(f"T5 model path {path} is a file; expected a directory with config.json, the weights and "
                         "the tokenizer files, or a hub id such as google/flan-t5-xl")
    if not local.is_dir() and not _looks_like_hub_id(path):
        raise ValueError(f"T5 model directory {path} does not exist (expected a directory with config.json, the "
                         "weights and the tokenizer files, or a hub id such as google/flan-t5-xl)")
    try:
        from transformers import AutoTokenizer, T5EncoderModel
    except ImportError as error:
        raise ImportError("text-to-image models need the transformers package: pip install transformers") from error
    if local.is_dir() and not (local / "config.json").is_file():
        raise ValueError(f"T5 model directory {path} has no config.json (expected the encoder's config.json, its "
                         "weights and the tokenizer files, as save_pretrained writes them)")
    where = str(local) if local.is_dir() else path
    offline = _offline() and not local.is_dir()
    try:
        tokenizer = AutoTokenizer.from_pretrained(where, local_files_only=offline)
        model = T5EncoderModel.from_pretrained(where, dtype=dtype, local_files_only=offline)
    except (OSError, ValueError) as error:
        kind = OSError if isinstance(error, OSError) else ValueError
        if local.is_dir():
            raise kind(f"cannot load a T5 encoder and tokenizer from the directory {path}: {error}") from error
        raise OSError(f"cannot load the T5 encoder {path!r}: it is not a local directory, and it is not in the "
                      f"local Hugging Face cache or cannot be downloaded (HF_HUB_OFFLINE="
                      f"{os.environ.get('HF_HUB_OFFLINE', '')!r}); download it where there is a network, or give "
                      f"a local directory ({error})") from error
    tokenizer.padding_side = "right"
    tokenizer.truncation_side = "right"
    return tokenizer, model.to(device).eval()
