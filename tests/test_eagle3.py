"""The EAGLE-3 drafter (coolsd.models.eagle.Eagle3Drafter): the target taps its layers only when asked, the
training-time test computes what chain drafting computes, the loss is EAGLE-3's, decoding with it keeps the
target's law (lossless), a batch gives each image its alone tokens, greedy decoding gives AR's tokens, and the
trainer, the bundle and the command line carry it beside Eagle-1."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import chi_square_pvalue, exact_distribution
from torch import nn

from coolsd.core.decode import EMPTY, decode, decode_batch, generate
from coolsd.core.rules import AR, Eagle, build_rule
from coolsd.core.sampling import SamplingConfig
from coolsd.core.trees import DraftTree, chain, parse_draft
from coolsd.distill.data import Shard
from coolsd.distill.objective import TTT_DECAY, ttt_features, ttt_loss
from coolsd.distill.trainer import TrainConfig, train_drafter
from coolsd.models.bundle import Bundle, load_bundle, random_bundle, save_bundle
from coolsd.models.config import ModelConfig
from coolsd.models.eagle import Drafter, Eagle3Drafter, default_taps
from coolsd.models.gpt import Transformer

CFG = ModelConfig(vocab_size=16, dim=32, n_layer=4, n_head=2, num_classes=3, grid_height=3, grid_width=3,
                  multiple_of=16)
# 4 codes, 5 tokens: every image enumerated exactly (tests/test_exactness.py's model, with layers to tap)
ENUM_CFG = ModelConfig(vocab_size=4, dim=16, n_layer=3, n_head=2, num_classes=2, grid_height=1, grid_width=5,
                       multiple_of=16)


def peaky(cfg: ModelConfig, std: float = 0.5, seed: int = 0) -> Bundle:
    """A random target with large weights and both drafters, large too (p and q far from uniform and apart)."""
    torch.manual_seed(seed)
    target, eagle1, eagle3 = Transformer(cfg).eval(), Drafter(cfg).eval(), Eagle3Drafter(cfg, (0, 1)).eval()
    with torch.no_grad():
        for module in (target, eagle1, eagle3):
            for name, param in module.named_parameters():
                if "norm" not in name:
                    param.normal_(0, std)
    codebook = nn.functional.normalize(torch.randn(cfg.vocab_size, 4), dim=-1)
    return Bundle(target, eagle3, codebook, name="peaky", drafters={"eagle1": eagle1, "eagle3": eagle3})


# --- the target's taps -----------------------------------------------------------------------------------------

def test_the_target_returns_the_inputs_of_the_tapped_layers_only_when_asked():
    torch.manual_seed(1)
    target = Transformer(CFG).eval()
    seen = {}
    for index, layer in enumerate(target.layers):
        layer.register_forward_pre_hook(lambda module, args, index=index: seen.__setitem__(index, args[0].clone()))
    x, positions = torch.randn(2, 5, CFG.dim), torch.arange(5)
    plain = target(x, positions)
    assert isinstance(plain, torch.Tensor)
    features, taps = target(x, positions, taps=(3, 0))
    assert torch.equal(features, plain)
    assert torch.equal(taps, torch.cat([seen[0], seen[3]], -1))  # in layer order
    assert default_taps(32) == (2, 16, 29) and default_taps(4) == (1, 2)


def test_only_a_drafter_that_reads_layers_makes_the_target_tap_them():
    bundle = peaky(CFG)
    asked = []
    forward = bundle.target.forward
    bundle.target.forward = lambda *args, taps=(), **kw: asked.append(taps) or forward(*args, taps=taps, **kw)
    for drafter, draft in ((None, EMPTY), (bundle.drafters["eagle1"], chain(3)), (None, parse_draft("jacobi:4")),
                           (bundle.drafters["eagle3"], chain(3))):
        asked.clear()
        decode(bundle.target, drafter, 1, Eagle(), draft, bundle.sampling, 0)
        wanted = (0, 1) if drafter is bundle.drafters["eagle3"] else ()
        assert asked and all(taps == wanted for taps in asked), (draft.name, set(asked))


def test_an_eagle3_drafter_needs_two_layers_of_its_target():
    with pytest.raises(ValueError, match="2 or more distinct target layers"):
        Eagle3Drafter(CFG, (1,))
    with pytest.raises(ValueError, match=r"in \[0, 3\]"):
        Eagle3Drafter(CFG, (0, 4))


# --- training-time test -------------------------------------------------------------------------------------

@torch.no_grad()
def chain_drafted(drafter: Eagle3Drafter, inputs: torch.Tensor, taps: torch.Tensor, slot: int,
                  steps: int) -> list[torch.Tensor]:
    """What decoding computes, written out with the drafter's KV cache as :class:`DrafterSource` uses it: the
    pairs up to ``slot`` committed from the target's taps, then ``steps - 1`` chain nodes, each from the last
    prediction and the next input, at the next position, seeing the committed pairs and the nodes before it."""
    cache = drafter.new_cache(inputs.shape[0], slot + steps + 1)
    mask = torch.ones(slot + 1, slot + 1, dtype=torch.bool).tril()
    hidden = drafter(inputs[:, :slot + 1], taps[:, :slot + 1], torch.arange(slot + 1), cache, 0, mask)[:, -1:]
    cache.commit(None, slot + 1)
    out = [hidden]
    for depth in range(1, steps):
        position = slot + depth
        hidden = drafter(inputs[:, position:position + 1], hidden, torch.tensor([position]), cache, depth - 1)
        out.append(hidden)
    return out


@pytest.mark.parametrize("extra_layers", [0, 1])
def test_training_time_test_computes_what_chain_drafting_computes(extra_layers):
    torch.manual_seed(2)
    bundle = peaky(CFG, std=0.3)
    drafter = Eagle3Drafter(CFG, (0, 2), extra_layers).share_embedding(bundle.target).eval()
    slots, steps = 9, 4
    inputs, taps = torch.randn(2, slots, CFG.dim), torch.randn(2, slots, 2 * CFG.dim)
    with torch.no_grad():
        trained = ttt_features(drafter, inputs, taps, steps)
    for slot in range(slots):
        reference = chain_drafted(drafter, inputs, taps, slot, min(steps, slots - slot))
        for step, want in enumerate(reference):
            torch.testing.assert_close(trained[step][:, slot:slot + 1], want, rtol=1e-5, atol=2e-4,
                                       msg=f"slot {slot}, step {step}")


def test_the_loss_is_eagle3s_decayed_soft_cross_entropy_over_the_image_slots():
    torch.manual_seed(3)
    bundle = peaky(CFG, std=0.3)
    drafter, head, prefix = bundle.drafters["eagle3"], bundle.target.logits, CFG.prefix_length
    n, length = CFG.image_tokens, CFG.prefix_length + CFG.image_tokens - 1
    batch = Shard(torch.randint(CFG.vocab_size, (2, n)), torch.randn(2, 2, length, CFG.dim),
                  torch.randn(2, 2, prefix - 1, CFG.dim), torch.randn(2, 2, length, 2 * CFG.dim))
    steps = 3
    loss, terms = ttt_loss(drafter, head, batch, prefix, torch.Generator().manual_seed(0), steps, noise=0.0,
                           unconditional=0.0)
    inputs = drafter.embed(batch.tokens[:, :-1])  # a class model: no lead inputs, slot s reads token s
    want = 0.0
    for step in range(steps):
        per_slot = []
        for slot in range(prefix - 1, length - 1 - step):  # slot s drafts the token after feature s + step + 1
            predicted = chain_drafted(drafter, inputs, batch.taps[:, 0, :-1], slot, step + 1)[-1]
            label = head(batch.features[:, 0, slot + step + 1]).softmax(-1)
            log_q = drafter.logits(predicted[:, 0], head).log_softmax(-1)
            per_slot.append(-(label * log_q).sum(-1))
        ce = torch.stack(per_slot, 1).mean()
        torch.testing.assert_close(terms[f"soft_ce_{step}"], ce, rtol=1e-4, atol=1e-5)
        want = want + TTT_DECAY ** step * ce
    torch.testing.assert_close(loss, want, rtol=1e-4, atol=1e-5)


@torch.inference_mode()
def test_the_engine_drafts_from_the_targets_taps_and_the_drafters_own_head():
    """The first round's chain, by the engine, against the drafter run by hand: the prefix's taps and the first
    token give depth 1's feature; each depth's ``q`` is the guided softmax of the drafter's logits (its own norm,
    then the target's head), and each drafted token feeds the next depth."""
    from coolsd.core.decode import Workspace, draft_phase, prefill
    from coolsd.core.sampling import probabilities
    bundle = peaky(CFG, std=0.3)
    target, drafter, sampling = bundle.target, bundle.drafters["eagle3"], SamplingConfig(cfg_scale=2.0)
    ws = Workspace(target, drafter, Eagle(), chain(3), sampling)
    ws.reset([9])
    prefill(ws, [2])
    draft_phase(ws)
    _, taps = target(target.prefix(2, 2).embeds, torch.arange(1), taps=drafter.target_layers)
    cache = drafter.new_cache(2, 8)
    hidden = drafter(drafter.embed(ws.tokens[:, :1]).expand(2, -1, -1), taps, torch.arange(1), cache)
    cache.commit(None, 1)
    for depth in range(1, 4):
        q = probabilities(drafter.logits(hidden, target.logits).unflatten(0, (2, -1)), sampling)[0, 0]
        torch.testing.assert_close(ws.q[0, depth - 1].float(), q, rtol=1e-5, atol=1e-6)
        token = ws.node_tokens[0, depth:depth + 1]
        hidden = drafter(drafter.embed(token)[None].expand(2, -1, -1), hidden, torch.tensor([depth]), cache, depth - 1)


# --- decoding with it: exactness unchanged ------------------------------------------------------------------

SMALL_TREE = DraftTree(((0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0)), "small")


@pytest.mark.parametrize("tree, sampling", [(chain(3), SamplingConfig(cfg_scale=1.5, top_p=0.95)),
                                            (SMALL_TREE, SamplingConfig(cfg_scale=1.5, top_k=3))])
def test_lossless_decoding_with_an_eagle3_drafter_keeps_the_targets_law(tree, sampling):
    bundle = peaky(ENUM_CFG)
    law = exact_distribution(bundle.target, 1, sampling)
    samples, drawn, tau = 2_000, [], 0.0
    for seed in range(samples):
        gen = decode(bundle.target, bundle.drafters["eagle3"], 1, Eagle(), tree, sampling, seed)
        drawn.append(tuple(gen.tokens))
        tau += gen.stats.tau / samples
    pvalue = chi_square_pvalue(drawn, law)
    assert pvalue > 1e-3, f"chi-square p-value {pvalue:.2e} over {samples} images"
    assert tau > 1.05  # drafts were accepted (a random drafter agrees rarely): the speculative path ran


@pytest.mark.parametrize("method, draft", [("eagle", "chain:4"), ("cool", "tree:eagle25")])
def test_a_batch_with_an_eagle3_drafter_gives_each_image_its_alone_tokens(method, draft):
    bundle = peaky(CFG, std=0.3)
    tree = parse_draft(draft)
    rule = build_rule(method, {"delta": 2.0} if method == "cool" else {}, tree.depth, bundle)
    classes, seeds = [2, 0, 1], [5, 6, 7]
    batch = decode_batch(bundle.target, bundle.drafter, classes, rule, tree, bundle.sampling, seeds)
    for cls, seed, got in zip(classes, seeds, batch):
        alone = decode(bundle.target, bundle.drafter, cls, rule, tree, bundle.sampling, seed)
        assert got.tokens == alone.tokens
        for a, b in zip(got.stats.rounds, alone.stats.rounds, strict=True):  # probabilities to float32 rounding
            a, b = a.to_dict(), b.to_dict()
            assert [a[k] for k in ("start", "valid", "emitted")] == [b[k] for k in ("start", "valid", "emitted")]
            valid = a["valid"]  # past the image's end a node is invalid, and what it holds is never read
            assert [t for t, v in zip(a["drafted"], valid) if v] == [t for t, v in zip(b["drafted"], valid) if v]
            assert [t["accepted"] for t in a["tested"]] == [t["accepted"] for t in b["tested"]]
            assert [t["accept_prob"] for t in a["tested"]] == pytest.approx([t["accept_prob"] for t in b["tested"]],
                                                                           rel=1e-4)


def test_greedy_decoding_with_an_eagle3_drafter_gives_greedy_ar_tokens():
    bundle = peaky(CFG, std=0.3)
    greedy = SamplingConfig(cfg_scale=2.0, top_k=1)
    accepted = 0
    for cls, seed in [(c, s) for c in range(3) for s in range(4)]:
        ar = decode(bundle.target, None, cls, AR(), EMPTY, greedy, seed).tokens
        got = decode(bundle.target, bundle.drafters["eagle3"], cls, Eagle(), parse_draft("tree:eagle25"), greedy,
                     seed + 1)
        assert got.tokens == ar
        accepted += CFG.image_tokens - got.stats.target_forwards
    assert accepted > 0  # some drafts were accepted (a random drafter's top choice is the target's 1 in 16)


# --- bundle, trainer, command line ------------------------------------------------------------------------------

def test_a_bundle_saves_and_loads_both_drafters_and_switches_between_them(tmp_path):
    bundle = peaky(CFG)
    save_bundle(bundle.with_drafter("eagle1"), tmp_path / "b")
    from safetensors.torch import save_model
    save_model(bundle.drafters["eagle3"], tmp_path / "b" / "eagle3.safetensors")
    meta = json.loads((tmp_path / "b" / "config.json").read_text())
    (tmp_path / "b" / "config.json").write_text(json.dumps({**meta, "eagle3": {"taps": [0, 1]}}))
    loaded = load_bundle(tmp_path / "b", device="cpu")
    assert list(loaded.drafters) == ["eagle1", "eagle3"] and loaded.drafter_name == "eagle1"
    three = loaded.with_drafter("eagle3")
    assert three.drafter.target_layers == (0, 1) and three.drafter_name == "eagle3"
    for name in ("eagle1", "eagle3"):
        want = generate(bundle.with_drafter(name), 1, Eagle(), chain(3), seed=4).tokens
        assert generate(loaded.with_drafter(name), 1, Eagle(), chain(3), seed=4).tokens == want
    stepped = three.with_steps("static")
    assert stepped.drafter_name == "eagle3" and stepped.with_drafter("eagle1").drafter_name == "eagle1"
    with pytest.raises(ValueError, match=r"^this model has no eagle3 drafter \(it has: eagle1\)$"):
        random_bundle("tiny", device="cpu").with_drafter("eagle3")


def test_the_trainer_makes_an_eagle3_drafter_that_drafts_better_than_untrained(tmp_path):
    bundle = random_bundle("tiny", device="cpu")
    with torch.no_grad():
        bundle.target.output.weight.mul_(30)
    bundle.sampling = SamplingConfig(cfg_scale=2.0)
    config = TrainConfig(images=128, epochs=4, batch=32, lr=3e-3, gen_batch=64, kind="eagle3", ttt_steps=3,
                         checkpoint_every=5)
    result = train_drafter(bundle, config, tmp_path / "run", progress=False)
    assert result.finished and result.drafter.target_layers == default_taps(bundle.config.n_layer)
    assert sum(result.losses[-4:]) < sum(result.losses[:4])
    # interrupted then resumed: the same weights
    first = train_drafter(bundle, config, tmp_path / "again", progress=False, stop_after=7)
    assert not first.finished
    resumed = train_drafter(bundle, config, tmp_path / "again", progress=False)
    state, want = resumed.drafter.state_dict(), result.drafter.state_dict()
    assert all(torch.equal(state[k], want[k]) for k in want)


@pytest.fixture(scope="module")
def both_drafters(tmp_path_factory):
    """A tiny random model with its Eagle-1 drafter and an EAGLE-3 drafter trained by the command line."""
    from coolsd.distill import command
    out = tmp_path_factory.mktemp("eagle3") / "model"
    assert command.main(["--random-init", "tiny", "--kind", "eagle3", "--ttt-steps", "2", "--out", str(out),
                         "--images", "64", "--epochs", "1", "--batch", "32", "--gen-batch", "32", "--eval-images", "2",
                         "--no-progress"]) == 0
    return out


def test_the_trained_model_carries_both_drafters_and_its_card_names_eagle3(both_drafters):
    bundle = load_bundle(both_drafters, device="cpu")
    assert list(bundle.drafters) == ["eagle1", "eagle3"]
    meta = json.loads((both_drafters / "config.json").read_text())
    assert meta["eagle3"]["taps"] == list(default_taps(bundle.config.n_layer))
    assert meta["eagle3"]["training"]["settings"]["ttt_steps"] == 2
    card = (both_drafters / "README.md").read_text()
    assert "EAGLE-3" in card and "--kind eagle3" in card
    reference = random_bundle("tiny", device="cpu")  # the Eagle-1 drafter is the random model's, kept
    assert torch.equal(bundle.drafters["eagle1"].fc.weight, reference.drafter.fc.weight)


def test_generate_and_bench_draft_with_the_drafter_asked_for(both_drafters, tmp_path):
    from coolsd.cli import bench
    from coolsd.cli import generate as generate_command
    bundle = load_bundle(both_drafters, device="cpu")
    stats = tmp_path / "stats.json"
    assert generate_command.main(["--model", str(both_drafters), "--drafter", "eagle3", "--method", "eagle",
                                  "--class", "2", "--seed", "3", "--stats", str(stats), "--out",
                                  str(tmp_path / "x.png")]) == 0
    want = generate(bundle.with_drafter("eagle3"), 2, Eagle(), parse_draft("chain:5"), seed=3)
    other = generate(bundle.with_drafter("eagle1"), 2, Eagle(), parse_draft("chain:5"), seed=3)
    record = json.loads(stats.read_text())
    assert record["image_tokens"] == want.tokens and record["drafter"] == "eagle3"
    drafted = [r["drafted"] for r in record["rounds"][1:]]
    assert drafted == [r.drafted for r in want.stats.rounds[1:]] != [r.drafted for r in other.stats.rounds[1:]]
    out = tmp_path / "bench.json"
    assert bench.main(["--model", str(both_drafters), "--methods", "eagle", "cool:delta=2", "--drafter", "eagle1",
                       "eagle3", "--images", "2", "--warmup", "0", "--steps", "eager", "--out", str(out),
                       "--no-progress"]) == 0
    runs = json.loads(out.read_text())["runs"]
    assert [(r["label"], r["drafter"]) for r in runs] == [
        ("ar", None), ("eagle", "eagle1"), ("eagle [eagle3]", "eagle3"), ("cool:delta=2", "eagle1"),
        ("cool:delta=2 [eagle3]", "eagle3")]
    taus = {r["label"]: r["tau"] for r in runs}
    for label, name in (("eagle", "eagle1"), ("eagle [eagle3]", "eagle3")):
        want = [generate(bundle.with_drafter(name), i % 10, Eagle(), parse_draft("chain:5"), seed=i).stats.tau
                for i in range(2)]
        assert taus[label] == pytest.approx(sum(want) / 2)
    assert runs[2]["eagle_baseline"] == "eagle [eagle3]" and runs[4]["eagle_baseline"] == "eagle [eagle3]"


@pytest.mark.parametrize("argv, needle", [
    (["--random-init", "tiny", "--drafter", "eagle3"], "this model has no eagle3 drafter (it has: eagle1)"),
    (["--random-init", "tiny", "--drafter", "medusa"], "--drafter must be one of eagle1, eagle3, got 'medusa'"),
])
def test_a_drafter_the_model_lacks_is_a_one_line_error(argv, needle, capsys):
    from coolsd.cli import generate as generate_command
    assert generate_command.main(["--method", "eagle", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1


def test_a_llamagen_text_model_gets_an_eagle3_drafter_beside_its_lantern_drafter(tmp_path):
    """LlamaGen's t2i format (its GPT checkpoint, VQ-16, T5, LANTERN's drafter; tiny random weights, as
    tests/test_model_json.py writes them): the trainer writes ``eagle3/`` and a model.json that loads both, and
    greedy decoding with the EAGLE-3 drafter gives greedy AR's tokens, through the command line."""
    from test_model_json import write_model_dir

    from coolsd.cli import generate as generate_command
    from coolsd.distill import command
    source = write_model_dir(tmp_path / "source")
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red fox\na blue bird in a tree\nan old boat on a lake\n")
    out = tmp_path / "out"
    assert command.main(["--model", str(source), "--kind", "eagle3", "--ttt-steps", "2", "--out", str(out),
                         "--prompts", str(prompts), "--images", "32", "--epochs", "1", "--gen-batch", "32",
                         "--eval-images", "2", "--device", "cpu", "--no-progress"]) == 0
    spec = json.loads((out / "model.json").read_text())
    assert spec["eagle3"] == "eagle3" and (out / "eagle3" / "model.safetensors").exists()
    bundle = load_bundle(out, device="cpu")
    assert list(bundle.drafters) == ["eagle1", "eagle3"] and type(bundle.drafter).__name__ == "LanternDrafter"
    tokens = {}
    for method, drafter in (("ar", []), ("eagle", ["--drafter", "eagle3"])):
        stats = tmp_path / f"{method}.json"
        assert generate_command.main(["--model", str(out), "--prompt", "a photo of a cat", "--method", method,
                                      *drafter, "--top-k", "1", "--device", "cpu", "--stats", str(stats)]) == 0
        tokens[method] = json.loads(stats.read_text())["image_tokens"]
    assert tokens["ar"] == tokens["eagle"]


def test_the_shipped_model_carries_a_trained_eagle3_drafter_whose_greedy_drafts_give_greedy_ar_tokens():
    bundle = load_bundle(device="cpu")
    assert list(bundle.drafters) == ["eagle1", "eagle3"] and bundle.drafter_name == "eagle1"
    three = bundle.drafters["eagle3"]
    assert three.target_layers == (2, 16, 29) and bundle.info["eagle3"]["training"]["settings"]["ttt_steps"] == 5
    greedy = SamplingConfig(cfg_scale=2.0, top_k=1)
    for cls, seed in ((1, 0), (7, 3)):
        ar = decode(bundle.target, None, cls, AR(), EMPTY, greedy, seed).tokens
        got = decode(bundle.target, three, cls, Eagle(), parse_draft("tree:eagle25"), greedy, seed + 1)
        assert got.tokens == ar
        assert got.stats.tau > 2  # a trained drafter: most drafts accepted
