"""Small models and exact reference distributions shared by the tests."""

from __future__ import annotations

import itertools

import numpy as np
import torch
from matplotlib.figure import Figure
from matplotlib.text import Text
from torch import nn

from coolsd.core.decode import Generation, generate
from coolsd.core.rules import build_rule
from coolsd.core.sampling import SamplingConfig
from coolsd.core.trees import parse_draft
from coolsd.models.bundle import Bundle
from coolsd.models.config import ModelConfig
from coolsd.models.eagle import Drafter
from coolsd.models.gpt import Transformer


def named(bundle: Bundle, class_id: int, method: str, params: dict | None = None, draft: str = "chain:5",
          sampling: SamplingConfig | None = None, seed: int = 0, capture: bool = False) -> Generation:
    """``generate`` from a method name and parameters, as the command line parses them."""
    tree = parse_draft(draft)
    rule = build_rule(method, params or {}, tree.depth, bundle)
    return generate(bundle, class_id, rule, tree, sampling, seed, capture)


def peaky_bundle(cfg: ModelConfig, seed: int = 0, std: float = 0.5, drafter_std: float | None = None) -> Bundle:
    """Random target and drafter with large weights, so p and q are far from uniform and from each other.
    ``drafter_std`` (default ``std``) makes ``q`` flatter or peakier than ``p``."""
    torch.manual_seed(seed)
    target, drafter = Transformer(cfg).eval(), Drafter(cfg).eval()
    with torch.no_grad():
        for module, scale in ((target, std), (drafter, std if drafter_std is None else drafter_std)):
            for name, param in module.named_parameters():
                if "norm" not in name:
                    param.normal_(0, scale)
    codebook = nn.functional.normalize(torch.randn(cfg.vocab_size, 4), dim=-1)
    return Bundle(target, drafter, codebook, name="peaky")


def l2_neighbours(codebook: torch.Tensor) -> np.ndarray:
    """Every code's other codes ordered by L2 distance of the code vectors (nearest first, ties by index), by
    brute force: LANTERN++'s neighbourhoods (spec section 3), independently of ``coolsd.rules.nearest_codes``."""
    codes = codebook.double().numpy()
    return np.array([sorted((z for z in range(len(codes)) if z != y),
                            key=lambda z: (float(np.sum((codes[z] - codes[y]) ** 2)), z)) for y in range(len(codes))])


def guidance_rows(sampling: SamplingConfig) -> int:
    """Model rows a distribution needs: conditional, plus unconditional unless guidance is the identity."""
    return 1 if sampling.cfg_scale == 1 else 2


def reference_probabilities(logits: np.ndarray, sampling: SamplingConfig) -> np.ndarray:
    """The spec's sampling transform (section 1), written independently of ``coolsd.sampling`` in float64.

    ``logits`` is (rows, ..., V) with the conditional row first: guidance ``l_u + s (l_c - l_u)``, top-k, top-p
    on the untempered filtered logits (smallest sorted prefix whose mass reaches ``top_p``; the first token is
    always kept), then temperature and softmax.
    """
    logits = np.asarray(logits, dtype=np.float64)
    if guidance_rows(sampling) == 1:
        guided = logits[0]
    else:
        cond, uncond = logits[0], logits[1]
        guided = uncond + sampling.cfg_scale * (cond - uncond)
    vocab = guided.shape[-1]
    if 0 < sampling.top_k < vocab:
        kth = np.sort(guided, axis=-1)[..., vocab - sampling.top_k, None]
        guided = np.where(guided >= kth, guided, -np.inf)
    if sampling.top_p < 1:
        order = np.argsort(-guided, axis=-1, kind="stable")
        ranked = np.take_along_axis(guided, order, axis=-1)
        mass = _softmax(ranked)
        before = np.concatenate([np.zeros_like(mass[..., :1]), np.cumsum(mass, axis=-1)[..., :-1]], axis=-1)
        kept_ranked = before < sampling.top_p  # the first token has 0 mass before it, so it is always kept
        kept = np.empty_like(kept_ranked)
        np.put_along_axis(kept, order, kept_ranked, axis=-1)
        guided = np.where(kept, guided, -np.inf)
    return _softmax(guided / sampling.temperature)


def _softmax(logits: np.ndarray) -> np.ndarray:
    """Softmax over the last axis; ``-inf`` entries get exactly zero."""
    shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return shifted / shifted.sum(axis=-1, keepdims=True)


def exact_distribution(target: Transformer, class_id: int, sampling: SamplingConfig) -> dict[tuple, float]:
    """P(x_1..x_N) of every token sequence, from uncached forwards over all prefixes (vanilla AR's law); the
    sampling transform is the independent reference, so a fault in ``coolsd.sampling`` shows up here."""
    cfg = target.config
    n, vocab = cfg.image_tokens, cfg.vocab_size
    seqs = torch.tensor(list(itertools.product(range(vocab), repeat=n)))
    rows = guidance_rows(sampling)
    labels = torch.tensor([class_id, cfg.null_class][:rows])
    with torch.no_grad():
        prefixes = seqs[::vocab]  # each distinct x_1..x_{N-1}
        inputs = torch.cat([target.sequence_inputs(target.class_prefix(labels.repeat_interleave(len(prefixes))),
                                                   prefixes.repeat(rows, 1))], dim=0)
        hidden = target(inputs, torch.arange(n))
        logits = target.output(hidden).view(rows, len(prefixes), n, vocab)
        probs = reference_probabilities(logits.numpy(), sampling)  # (prefixes, n, V)
    law = {}
    for i, seq in enumerate(seqs.tolist()):
        prefix = probs[i // vocab]
        law[tuple(seq)] = float(np.prod([prefix[t, seq[t]] for t in range(n)]))
    return law


def chi_square_pvalue(samples: list[tuple], law: dict[tuple, float], min_expected: float = 5.0) -> float:
    """Pearson's test of ``samples`` against ``law``; cells expected below ``min_expected`` are pooled."""
    counts: dict[tuple, int] = {}
    for s in samples:
        counts[s] = counts.get(s, 0) + 1
    n = len(samples)
    stat, cells, pool_obs, pool_exp = 0.0, 0, 0, 0.0
    for seq, prob in law.items():
        expected, observed = n * prob, counts.get(seq, 0)
        if expected < min_expected:
            pool_obs += observed
            pool_exp += expected
        else:
            stat += (observed - expected) ** 2 / expected
            cells += 1
    if pool_exp > 0:
        stat += (pool_obs - pool_exp) ** 2 / pool_exp
        cells += 1
    dof = cells - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64)))


def counts_pvalue(observed: torch.Tensor, probs: torch.Tensor, min_expected: float = 5.0) -> float:
    """Pearson's test of counts per cell ``observed`` (C,) against cell probabilities ``probs`` (C,), for
    vectorised draws: 0 if a cell of probability 0 was observed (an impossible draw); cells expected below
    ``min_expected`` are pooled; 1 when fewer than two cells are left (nothing to test)."""
    observed, probs = observed.double(), probs.double()
    if bool((observed[probs == 0] > 0).any()):
        return 0.0
    expected = observed.sum() * probs
    large = expected >= min_expected
    stat = float(((observed[large] - expected[large]) ** 2 / expected[large]).sum())
    cells = int(large.sum())
    pooled = float(expected[~large].sum())
    if pooled > 0:
        stat += (float(observed[~large].sum()) - pooled) ** 2 / pooled
        cells += 1
    if cells < 2:
        return 1.0
    return float(torch.special.gammaincc(torch.tensor((cells - 1) / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64)))


def count_generations(monkeypatch) -> list[str]:
    """The method name of every image the benchmark generates from now on, in order."""
    from coolsd.cli import passes

    calls = []
    real_generate = passes.generate_batch

    def counted(*args, **kwargs):
        calls.extend([args[2].name] * len(args[1]))  # one per image of the call
        return real_generate(*args, **kwargs)

    monkeypatch.setattr(passes, "generate_batch", counted)
    return calls


def markdown_table(text: str, header: str) -> list[list[str]]:
    """The body rows, as stripped cells, of the first Markdown table in ``text`` whose header row starts with
    ``header`` (a documentation page's table read the way a reader sees it)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip()[1:-1].split("|")])
    return rows


# Figures as the app shows them: a PNG at the figure's dpi, scaled to its panel's width -----------------------
PHONE_PANEL, DESKTOP_PANEL, DESKTOP_MAP_PANEL = 360, 800, 400  # px: the app's panels (two maps side by side)


def hidden_tick_labels(fig: Figure) -> set[int]:
    """Tick labels matplotlib keeps outside an axis's view limits (never drawn)."""
    hidden = set()
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            low, high = sorted(axis.get_view_interval())
            for tick in axis.get_major_ticks() + axis.get_minor_ticks():
                if not low - 1e-9 <= tick.get_loc() <= high + 1e-9:
                    hidden |= {id(tick.label1), id(tick.label2)}
    return hidden


def shown_texts(fig: Figure) -> list[Text]:
    """Every text artist the figure draws (with text, visible, not a tick label outside the view)."""
    hidden = hidden_tick_labels(fig)
    return [t for t in fig.findobj(Text) if t.get_visible() and t.get_text() and id(t) not in hidden]


def on_screen_px(text: Text, fig: Figure, panel: float) -> float:
    """A text's height on screen: its size in the PNG (points at the figure's dpi) scaled to the panel's width."""
    return text.get_fontsize() * fig.dpi / 72 * panel / (fig.get_figwidth() * fig.dpi)


def small_texts(fig: Figure, panel: float) -> list[tuple[str, float]]:
    """Every drawn text under 10 px on screen in a panel ``panel`` px wide (legends and tick labels too)."""
    fig.canvas.draw()
    return [(t.get_text(), round(on_screen_px(t, fig, panel), 1)) for t in shown_texts(fig)
            if on_screen_px(t, fig, panel) < 10]


def plant_host_read(monkeypatch) -> None:
    """A planted fault: the acceptance walk reads its count into Python (a host read inside verification)."""
    from coolsd.core import decode as decode_module
    original = decode_module.walk

    def reads(*args, **kwargs):
        verdict = original(*args, **kwargs)
        verdict.count[0].item()
        return verdict

    monkeypatch.setattr(decode_module, "walk", reads)
