"""A Chameleon model through the decoding engine, the command line and the trainer: structural tokens where the
official sampler puts them (spec section 8), greedy Eagle-1 = greedy AR, Property 1 on an enumerated constrained
model with guidance, the generate command's image and token record, and a trained drafter that loads back."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
import torch
from chameleon_fixture import build_model_dir
from helpers import chi_square_pvalue
from test_chameleon import official_kinds

from coolsd.core.decode import EMPTY, decode, decode_batch, generate
from coolsd.core.interface import PositionRules
from coolsd.core.likelihood import token_log_likelihoods
from coolsd.core.rules import Eagle
from coolsd.core.sampling import SamplingConfig
from coolsd.core.trees import chain, parse_draft
from coolsd.models.bundle import load_bundle
from coolsd.models.chameleon import ChameleonPrompt, load_chameleon
from coolsd.models.chameleon_drafter import ChameleonDrafter, load_chameleon_drafter

IMAGE_IDS = set(range(4, 8196))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_model_dir(tmp_path_factory.mktemp("chameleon-engine") / "model")


@pytest.fixture(scope="module")
def bundle(tiny):
    return load_bundle(tiny, device="cpu")


def check_layout(tokens: list[int], side: int) -> None:
    kinds = official_kinds(side)
    assert len(tokens) == len(kinds)
    for t, (token, kind) in enumerate(zip(tokens, kinds)):
        expected = {"newline": {8803}, "end": {8196}, "image": IMAGE_IDS}[kind]
        assert token in expected, f"position {t} ({kind}) drew {token}"


@pytest.mark.parametrize("method", ["ar", "eagle"])
@pytest.mark.parametrize("sampling", [SamplingConfig(cfg_scale=3.0, top_k=1), SamplingConfig(cfg_scale=3.0,
                                                                                             top_k=2000)],
                         ids=["greedy", "sampled"])
def test_structural_tokens_appear_where_the_official_sampler_puts_them(bundle, method, sampling):
    prompt = bundle.text_encoder(["a red fox"])[0]
    tree = chain(5) if method == "eagle" else EMPTY
    for seed in range(3):
        tokens = decode(bundle.target, bundle.drafter, prompt, Eagle(), tree, sampling, seed).tokens
        check_layout(tokens, 4)


@pytest.mark.parametrize("draft", ["chain:5", "tree:eagle25"])
def test_greedy_eagle_gives_greedy_ar_tokens(bundle, draft):
    sampling = SamplingConfig(cfg_scale=3.0, top_k=1)
    for text in ("a red fox", "a bowl of ramen"):
        prompt = bundle.text_encoder([text])[0]
        ar = decode(bundle.target, bundle.drafter, prompt, Eagle(), EMPTY, sampling, 0).tokens
        eagle = decode(bundle.target, bundle.drafter, prompt, Eagle(), parse_draft(draft), sampling, 0).tokens
        assert eagle == ar
        check_layout(ar, 4)


@pytest.mark.parametrize("draft", ["chain:5", "tree:eagle25"])
def test_a_batch_of_prompts_of_different_lengths_gives_each_its_alone_tokens(bundle, draft):
    """Spec sections 8 and 9: three prompts padded by different amounts (each row's RoPE shifted by its own
    padding), forced structural positions, one batch: each image gets its alone tokens and its layout."""
    prompts = bundle.text_encoder(["a red fox", "a photo of a bowl of ramen in the snow", "a lighthouse"])
    sampling, tree, seeds = SamplingConfig(cfg_scale=3.0, top_k=2000), parse_draft(draft), [5, 6, 7]
    batch = decode_batch(bundle.target, bundle.drafter, prompts, Eagle(), tree, sampling, seeds)
    for prompt, seed, got in zip(prompts, seeds, batch):
        assert got.tokens == decode(bundle.target, bundle.drafter, prompt, Eagle(), tree, sampling, seed).tokens
        check_layout(got.tokens, 4)


# --- Property 1 on an enumerated constrained model -------------------------------------------------------------

FREE = (4, 5, 6)  # the image codes the test's rules allow: 3^4 images of a 2 x 2 grid


def small_rules(vocab: int) -> PositionRules:
    """A 32 px Lumina-mGPT layout (2 rows of 2 codes, each closed by a newline, then end-of-image), with image
    positions restricted to three codes so that every image can be enumerated."""
    allowed = torch.zeros(3, vocab, dtype=torch.bool)
    allowed[0, list(FREE)] = True
    allowed[1, 8803] = True
    allowed[2, 8196] = True
    return PositionRules(torch.tensor([0, 0, 1, 0, 0, 1, 2]), allowed)


def exact_law(target, prompt: ChameleonPrompt, sampling: SamplingConfig) -> dict[tuple, float]:
    """P(image) by teacher-forced uncached forwards of every sequence, the guidance, masking and filtering
    written here: ``u + s (c - u)`` in float64, disallowed tokens removed, then top-k among what is left, then
    softmax (temperature 1)."""
    images = [list(codes) for codes in itertools.product(FREE, repeat=4)]
    sequences = [[a, b, 8803, c, d, 8803, 8196] for a, b, c, d in images]
    prefix = target.prefix(prompt, 2)
    p = prefix.length
    tokens = torch.tensor(sequences)
    with torch.no_grad():
        x = torch.cat([prefix.embeds.repeat_interleave(len(sequences), 0),
                       target.embed(tokens[:, :-1]).repeat(2, 1, 1)], 1)
        valid = torch.cat([prefix.valid.repeat_interleave(len(sequences), 0),
                           torch.ones(2 * len(sequences), 6, dtype=torch.bool)], 1)
        logits = target.logits(target(x, torch.arange(p + 6), valid=valid))[:, p - 1:].double()
    cond, uncond = logits[:len(sequences)], logits[len(sequences):]
    guided = uncond + sampling.cfg_scale * (cond - uncond)
    rules = small_rules(target.vocab_size)
    allowed = rules.allowed[rules.kinds]  # (7, V)
    masked = guided.masked_fill(~allowed, -np.inf)
    kth = masked.topk(sampling.top_k, dim=-1).values[..., -1:]  # top-k after the mask: forced rows keep one
    probs = masked.masked_fill(masked < kth, -np.inf).softmax(-1)
    law = {}
    for i, seq in enumerate(sequences):
        law[tuple(seq)] = float(np.prod([probs[i, t, seq[t]].item() for t in range(7)]))
    return law


SMALL_PROMPT = ChameleonPrompt((0, 8843, 8844, 8845, 8710, 8197, 8805, 8805), "a red fox")
SMALL_SAMPLING = SamplingConfig(cfg_scale=2.0, top_k=2)  # 2 of the 3 allowed codes: top-k before the mask differs


@pytest.fixture(scope="module")
def small_target(tiny):
    target = load_chameleon(tiny / "hf", 32, "lumina", prefix_slots=24, progress=False)
    target.position_rules = small_rules(target.vocab_size)
    with torch.no_grad():
        for param in target.parameters():  # peaky enough that p and q differ, far from uniform
            if param.dim() == 2:
                param.mul_(3.0)
    return target


def test_the_likelihood_of_an_image_is_its_constrained_law(small_target):
    law = exact_law(small_target, SMALL_PROMPT, SMALL_SAMPLING)
    images = sorted(law, key=law.get)[-5:]  # the likeliest, some structural tokens in each
    for image in images:
        got = token_log_likelihoods(small_target, SMALL_PROMPT, list(image), SMALL_SAMPLING)
        assert got.sum() == pytest.approx(np.log(law[image]), abs=1e-5)
    excluded = [image for image, prob in law.items() if prob == 0][0]
    assert np.isneginf(token_log_likelihoods(small_target, SMALL_PROMPT, list(excluded), SMALL_SAMPLING).sum())


@pytest.mark.parametrize("draft", ["chain:3", "jacobi:4:coupled"])  # AR's law: the likelihood test checks the masked p
def test_lossless_decoding_keeps_the_constrained_law(tiny, small_target, draft):
    target, prompt, sampling = small_target, SMALL_PROMPT, SMALL_SAMPLING
    drafter = load_chameleon_drafter(tiny / "drafter", target.config)
    law = exact_law(target, prompt, sampling)
    assert abs(sum(law.values()) - 1) < 1e-9
    tree = EMPTY if draft == "ar" else parse_draft(draft)
    drawn = [tuple(decode(target, drafter, prompt, Eagle(), tree, sampling, seed).tokens) for seed in range(1200)]
    assert set(drawn) <= {image for image, prob in law.items() if prob > 0}  # nothing the rules or top-k exclude
    assert chi_square_pvalue(drawn, law) > 1e-3


@pytest.mark.parametrize("draft", ["chain:5", "tree:eagle25", "jacobi:8:coupled"])
def test_a_forced_position_is_drafted_as_its_token_and_always_accepted(bundle, draft):
    """The mask applies to the drafter's q too: at a forced position q is the same point mass as p, so the
    draft is the forced token, f = 1, and a rejection never happens there (spec section 8)."""
    kinds = official_kinds(4)
    forced = {"newline": 8803, "end": 8196}
    prompt = bundle.text_encoder(["a red fox"])[0]
    tested_forced = 0
    for seed in range(3):
        stats = decode(bundle.target, bundle.drafter, prompt, Eagle(), parse_draft(draft),
                       SamplingConfig(cfg_scale=3.0, top_k=2000), seed).stats
        for round_ in stats.rounds[1:]:
            for candidate in round_.tested:
                position = round_.start + candidate.depth - 1  # the generated position this draft fills
                if position < len(kinds) and kinds[position] in forced:
                    assert round_.drafted[candidate.node - 1] == forced[kinds[position]]
                    assert candidate.accept_prob == 1.0 and candidate.accepted
                    tested_forced += 1
    assert tested_forced > 0


# --- the command line and the trainer -------------------------------------------------------------------------

def test_generate_writes_the_image_and_records_every_token(tiny, tmp_path, capsys):
    from PIL import Image

    from coolsd.cli import generate as command
    stats, out = tmp_path / "s.json", tmp_path / "img.png"
    code = command.main(["--model", str(tiny), "--prompt", "a red fox", "--top-k", "1", "--stats", str(stats),
                         "--out", str(out), "--device", "cpu"])
    assert code == 0, capsys.readouterr().err
    assert Image.open(out).size == (512, 512)  # 64 px, enlarged 8x
    tokens = json.loads(stats.read_text())["image_tokens"]
    check_layout(tokens, 4)


def test_the_benchmark_runs_a_chameleon_model_on_the_example_prompts(tiny, tmp_path):
    from coolsd.cli import bench, passes
    from coolsd.models.registry import EXAMPLE_PROMPTS
    out = tmp_path / "r.json"
    assert bench.main(["--model", str(tiny), "--methods", "ar", "eagle", "--draft", "chain:5", "--images", "2",
                       "--warmup", "0", "--device", "cpu", "--out", str(out), "--no-progress"]) == 0
    runs = json.loads(out.read_text())["runs"]
    assert {run["method"] for run in runs} == {"ar", "eagle"}
    for run in runs:  # finite: the forced tokens have likelihood 1 under the masked target
        assert np.isfinite(run["log_likelihood_per_token"])
    conditions = passes.benchmark_conditions(load_bundle(tiny, device="cpu"))
    assert [condition.text for condition in conditions] == list(EXAMPLE_PROMPTS)


def test_the_trained_drafter_is_written_in_lantern_format_loads_back_and_drafts(tiny, tmp_path):
    from coolsd.distill import command
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a photo of a red fox\na bowl of ramen in snow\na lighthouse\n")
    out = tmp_path / "out"
    assert command.main(["--model", str(tiny), "--out", str(out), "--images", "4", "--epochs", "1", "--batch", "2",
                         "--gen-batch", "2", "--eval-images", "1", "--prompts", str(prompts), "--no-progress",
                         "--device", "cpu"]) == 0
    assert sorted(p.name for p in (out / "drafter").iterdir()) == ["config.json", "pytorch_model.bin"]
    bundle = load_bundle(out, device="cpu")
    assert isinstance(bundle.drafter, ChameleonDrafter)
    trained = torch.load(out / "drafter" / "pytorch_model.bin", weights_only=True)
    assert torch.equal(bundle.drafter.fc.weight, trained["fc.weight"])
    result = generate(bundle, bundle.text_encoder(["a red fox"])[0], Eagle(), parse_draft("chain:5"),
                      SamplingConfig(cfg_scale=3.0, top_k=1))
    assert result.stats.drafter_forwards > 0 and len(result.tokens) == 21


@pytest.fixture(scope="module")
def with_eagle3(tiny, tmp_path_factory):
    """The tiny Lumina-mGPT directory with an EAGLE-3 drafter trained by the command line beside LANTERN's."""
    from coolsd.distill import command
    folder = tmp_path_factory.mktemp("chameleon-eagle3")
    prompts = folder / "prompts.txt"
    prompts.write_text("a photo of a red fox\na bowl of ramen in snow\na lighthouse\n")
    out = folder / "out"
    assert command.main(["--model", str(tiny), "--kind", "eagle3", "--ttt-steps", "3", "--out", str(out),
                         "--images", "4", "--epochs", "1", "--batch", "2", "--gen-batch", "2", "--eval-images", "1",
                         "--prompts", str(prompts), "--no-progress", "--device", "cpu"]) == 0
    return load_bundle(out, device="cpu")


def test_an_eagle3_drafter_for_lumina_loads_beside_lantern_s_and_keeps_greedy_ar_tokens(with_eagle3):
    from coolsd.models.chameleon_drafter import ChameleonEagle3Drafter
    assert list(with_eagle3.drafters) == ["eagle1", "eagle3"]
    three = with_eagle3.drafters["eagle3"]
    assert isinstance(three, ChameleonEagle3Drafter) and three.target_layers == (0, 1)
    assert torch.equal(three.embed_tokens.weight, with_eagle3.target.model.embed_tokens.weight)  # frozen copy
    sampling = SamplingConfig(cfg_scale=3.0, top_k=1)
    for text in ("a red fox", "a bowl of ramen"):
        prompt = with_eagle3.text_encoder([text])[0]
        ar = decode(with_eagle3.target, None, prompt, Eagle(), EMPTY, sampling, 0).tokens
        for draft in ("chain:5", "tree:eagle25"):
            got = decode(with_eagle3.target, three, prompt, Eagle(), parse_draft(draft), sampling, 0)
            assert got.tokens == ar and got.stats.drafter_forwards > 0
        check_layout(ar, 4)


def test_an_eagle3_batch_of_padded_prompts_gives_each_its_alone_tokens(with_eagle3):
    """Prompts padded by different amounts: the taps are zero at padding, the head shifts each row's RoPE by
    its own padding, and each image of a batch gets its alone tokens."""
    prompts = with_eagle3.text_encoder(["a red fox", "a photo of a bowl of ramen in the snow", "a lighthouse"])
    sampling, tree, seeds = SamplingConfig(cfg_scale=3.0, top_k=2000), parse_draft("tree:eagle25"), [5, 6, 7]
    three = with_eagle3.drafters["eagle3"]
    batch = decode_batch(with_eagle3.target, three, prompts, Eagle(), tree, sampling, seeds)
    for prompt, seed, got in zip(prompts, seeds, batch):
        assert got.tokens == decode(with_eagle3.target, three, prompt, Eagle(), tree, sampling, seed).tokens
        check_layout(got.tokens, 4)


def test_the_chameleon_eagle3_training_test_is_what_its_chain_drafting_computes(with_eagle3):
    """The training-time test over a padded prompt (zero taps at the padding) against the head run as decoding
    runs it, with its KV cache: the committed slots, then one node per step."""
    from coolsd.distill.objective import ttt_features
    three, target = with_eagle3.drafters["eagle3"], with_eagle3.target
    prefix = target.prefix(with_eagle3.text_encoder(["a red fox"])[0], 2)
    tokens = torch.tensor([5, 6, 8803, 7, 4, 8803])
    inputs = torch.cat([prefix.embeds, target.embed(tokens)[None].expand(2, -1, -1)], 1)
    valid = torch.cat([prefix.valid, torch.ones(2, len(tokens), dtype=torch.bool)], 1)
    _, taps = target(inputs, torch.arange(inputs.shape[1]), valid=valid, taps=three.target_layers)
    slots, steps, first = inputs.shape[1] - 1, 3, prefix.length - 1
    nexts = three.embed(torch.cat([target.prefix_tokens(with_eagle3.text_encoder(["a red fox"])[0], 2)[0][:, 1:],
                                   tokens[None].expand(2, -1)], 1))
    with torch.no_grad():
        trained = ttt_features(three, nexts, taps[:, :slots], steps)
        for slot in range(first, slots - steps + 1):
            cache = three.new_cache(2, slot + steps + 1)
            mask = torch.ones(slot + 1, slot + 1, dtype=torch.bool).tril()
            hidden = three(nexts[:, :slot + 1], taps[:, :slot + 1], torch.arange(slot + 1), cache, 0, mask)[:, -1:]
            cache.commit(None, slot + 1)
            torch.testing.assert_close(trained[0][:, slot:slot + 1], hidden, rtol=1e-4, atol=1e-4)
            for depth in range(1, steps):
                position = slot + depth
                hidden = three(nexts[:, position:position + 1], hidden, torch.tensor([position]), cache, depth - 1)
                torch.testing.assert_close(trained[depth][:, slot:slot + 1], hidden, rtol=1e-4, atol=1e-4)


# --- the app ---------------------------------------------------------------------------------------------------

def test_the_app_generates_with_a_chameleon_directory_in_its_model_list(tiny, monkeypatch):
    """COOLSD_MODELS names the tiny Chameleon directory: it is listed, selected, generates through the UI's
    callbacks (image, Eagle-1 image, figures) and the API, the structural tokens where they belong."""
    from matplotlib.figure import Figure

    from coolsd.app import models, session
    from coolsd.app.web import api, generation, inputs, panels, runtime, settings
    monkeypatch.setenv(models.ENV, str(tiny))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(models, "hub_cached", lambda value, directory=False: False)
    assert str(tiny) in [choice.key for choice in runtime.start().models.choices()]
    outputs = dict(zip(settings.MODEL_OUTPUTS, settings.on_model(str(tiny), models.DEFAULT, False, progress=lambda *a, **k: 0)))
    assert outputs["prompt_box"]["visible"] is True and outputs["class_name"]["visible"] is False
    values = inputs.defaults()
    values.update(model=str(tiny), prompt="a red fox", cfg_scale=3.0)
    *_, (image, eagle_image, table, caption, _slider, result, *_race) = generation.on_generate(
        *[values[name] for name in session.value_names()], progress=lambda *a, **k: 0)
    assert image["value"].size == eagle_image["value"].size and image["value"].size[0] >= 64
    assert "a red fox" in caption and "speed-up vs AR" in table
    check_layout(result.method.tokens, 4)
    figures = generation.on_figures(result, "fid")
    assert all(isinstance(figure, Figure) for figure in figures[:6])
    assert isinstance(panels.on_replay(result, 0), Figure)
    answer = api.generate(method="COOL-SD", seed=3, model=str(tiny), prompt="a red fox")
    check_layout(answer["method"]["tokens"], 4)
    assert np.array(answer["method"]["pixels"]).shape == (64, 64, 3)
