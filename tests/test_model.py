"""Models and KV cache: cached steps, chain and tree scoring equal a full uncached forward."""

import random

import pytest
import torch
from helpers import named, peaky_bundle

from coolsd.core.decode import Workspace, draft_phase
from coolsd.core.rules import Eagle
from coolsd.core.sampling import SamplingConfig, probabilities
from coolsd.core.trees import DraftTree, chain, parse_draft
from coolsd.models.config import CONFIGS, ModelConfig
from coolsd.models.eagle import Drafter
from coolsd.models.gpt import Transformer, parameter_count

CFG = ModelConfig(vocab_size=11, dim=32, n_layer=2, n_head=2, num_classes=3, grid_height=3, grid_width=4,
                  multiple_of=16)


def reference_hidden(target: Transformer, labels: torch.Tensor, tokens: list[int]) -> torch.Tensor:
    """Uncached causal forward over [class, tokens...] -> hidden (rows, T, dim)."""
    seq = torch.tensor(tokens + [0])[None].expand(len(labels), -1)
    return target(target.sequence_inputs(target.class_prefix(labels), seq), torch.arange(len(tokens) + 1))


@pytest.mark.parametrize("rows", [1, 2])
def test_cache_matches_uncached_forward_over_rounds(rows):
    torch.manual_seed(0)
    random.seed(0)
    target = Transformer(CFG).eval()
    labels = torch.tensor([1, CFG.null_class][:rows])
    tree = parse_draft("tree:eagle25")
    cache = target.new_cache(rows, CFG.image_tokens + tree.size + 1)
    committed: list[int] = []  # tokens whose keys/values are in the cache (after the class token)
    with torch.no_grad():
        target(target.class_prefix(labels).embeds, torch.tensor([0]), cache)
        cache.commit([0])
        checks = 0
        while len(committed) + 1 < CFG.image_tokens:
            root = random.randrange(CFG.vocab_size)
            n = len(committed) + 1  # sequence position of the root token
            kind = random.choice(["step", "chain", "tree"])
            shape = {"step": DraftTree(()), "chain": chain(3), "tree": tree}[kind]
            shape = shape.truncated(CFG.image_tokens - n - 1)
            nodes = [root] + [random.randrange(CFG.vocab_size) for _ in range(shape.size)]
            mask = shape.ancestor_mask if shape.size else None
            embeds = target.tok_embeddings(torch.tensor(nodes))[None].expand(rows, -1, -1)
            hidden = target(embeds, n + torch.tensor(shape.depths), cache, 0, mask)
            for node in range(shape.size + 1):  # every node against the uncached forward of its own path
                path, walk = [], node
                while walk > 0:
                    path.insert(0, nodes[walk])
                    walk = shape.parent[walk]
                ref = reference_hidden(target, labels, committed + [root] + path)[:, -1]
                torch.testing.assert_close(hidden[:, node], ref, atol=1e-5, rtol=1e-4)
                checks += 1
            # commit a random root-to-node path, discard the rest
            end = random.randrange(shape.size + 1)
            keep, walk = [], end
            while walk > 0:
                keep.insert(0, walk)
                walk = shape.parent[walk]
            cache.commit([0] + keep)
            committed += [root] + [nodes[i] for i in keep]
            assert cache.length == len(committed) + 1
    assert checks > 20


def drafting_workspace(bundle, tree: DraftTree, sampling: SamplingConfig, seed: int = 0) -> Workspace:
    """A workspace for ``tree`` whose drafter has seen nothing yet (its caches empty, the generator seeded)."""
    ws = Workspace(bundle.target, bundle.drafter, Eagle(), tree, sampling)
    ws.reset([seed])
    ws.source.feature_buffers(ws, torch.zeros(sampling.rows, 1, CFG.dim))
    return ws


def catch_up_and_draft(ws: Workspace, committed: list[int], tokens: list[int], features: torch.Tensor):
    """One drafting phase after ``committed`` image tokens, catching up on the pairs (``features`` (rows, c,
    dim), ``tokens``): the engine's pending state, as the last round's verification leaves it."""
    count = len(tokens)
    ws.tokens[0, :len(committed)] = torch.tensor(committed)
    ws.n.fill_(len(committed))
    ws.source.pending_tokens[0, :count] = torch.tensor(tokens)
    ws.source.pending_features[:, :count] = features
    ws.source.pending_count.fill_(count)
    ws.draw_randoms(ws.walk_uniforms)  # the races this round's drafting reads, as a verification leaves them
    draft_phase(ws)
    return ws.node_tokens[0].clone(), ws.node_valid[0].clone(), ws.q[0].clone(), ws.source.node_features.clone()


def test_drafter_tree_matches_uncached_drafter():
    """Drafted tree features equal an uncached drafter run along each node's path (Eagle-1 inputs)."""
    bundle = peaky_bundle(CFG, std=0.3)
    target, drafter = bundle.target, bundle.drafter
    sampling = SamplingConfig(cfg_scale=2.0)
    tree = parse_draft("tree:eagle25").truncated(3)
    rows = 2
    committed = [3, 7, 1]  # x_1..x_3
    features = torch.randn(rows, 3, CFG.dim)  # stand-ins for target features h_0..h_2
    ws = drafting_workspace(bundle, tree, sampling)
    with torch.no_grad():
        # first round caught up on h_0 only; second round on h_1, h_2 with tokens x_2, x_3
        catch_up_and_draft(ws, committed[:1], committed[:1], features[:, :1])
        tokens, valid, q, node_features = catch_up_and_draft(ws, committed, committed[1:], features[:, 1:])
        assert ws.source.cache.length == 3
        for node in range(1, tree.levels[tree.depth].start):  # the deepest level is not fed back
            path, walk = [], node
            while walk > 0:
                path.insert(0, walk)
                walk = tree.parent[walk]
            # uncached: inputs (embed(x_{i+1}), feature_i), the drafter's own predictions along the path
            toks, feats = list(committed), features
            out = drafter(target.tok_embeddings(torch.tensor(toks))[None].expand(rows, -1, -1), feats,
                          torch.arange(len(toks)))
            for i in path:
                toks, feats = toks + [tokens[i].item()], torch.cat([feats, out[:, -1:]], dim=1)
                out = drafter(target.tok_embeddings(torch.tensor(toks))[None].expand(rows, -1, -1), feats,
                              torch.arange(len(toks)))
            torch.testing.assert_close(node_features[:, node], out[:, -1], atol=1e-4, rtol=1e-4)
            if tree.children[node]:  # the draft rows: one per inner node, in node order
                expected_q = probabilities(target.output(out[:, -1:]), sampling)[0]
                torch.testing.assert_close(q[tree.inner_nodes.index(node)].float(), expected_q, atol=1e-6, rtol=1e-5)
            assert valid[node]


@pytest.mark.parametrize("spec", ["chain:5", "tree:eagle25", "tree:wide57"])
def test_level_indices_stand_for_their_lists(spec):
    """The loop's per-level indices (slices where they are runs) select exactly the listed rows, and only a
    chain's levels skip the drafter's mask: one node whose ancestors are every earlier node."""
    tree = parse_draft(spec)
    rows = torch.arange(1000)
    for depth, (listed, level) in enumerate(zip(tree.level_draws, tree.tensors(torch.device("cpu"))["levels"]), 1):
        for key in ("parents", "distinct", "drawn"):
            assert rows[level[key]].tolist() == listed[key]
        earlier = range(1, tree.levels[depth].start)
        node = tree.levels[depth].start
        expected = len(tree.levels[depth]) == 1 and all(node in descendants(tree, e) for e in earlier)
        assert level["sees_all"] == expected
    assert all(level["sees_all"] for level in tree.level_draws) == spec.startswith("chain")


def descendants(tree: DraftTree, node: int) -> set[int]:
    out, todo = set(), [node]
    while todo:
        for child in tree.children[todo.pop()]:
            out.add(child)
            todo.append(child)
    return out


def test_drafted_siblings_are_distinct_draws_of_their_parents_distribution():
    """Each node's token comes from its own parent's draws, in rank order: siblings never repeat a token, and
    every token has nonzero draft probability under its parent (a node reading another parent's draws or
    another rank breaks one or the other on this peaky model)."""
    bundle = peaky_bundle(CFG, std=0.3)
    sampling = SamplingConfig(cfg_scale=2.0, top_k=3)
    tree = parse_draft("tree:eagle25").truncated(3)
    for seed in range(5):
        ws = drafting_workspace(bundle, tree, sampling, seed)
        features = torch.randn(2, 2, CFG.dim, generator=torch.Generator().manual_seed(seed))
        with torch.no_grad():
            tokens, valid, q, _ = catch_up_and_draft(ws, [3, 7], [3, 7], features)
        for parent, children in enumerate(tree.children):
            drawn = [int(tokens[c]) for c in children if valid[c]]
            assert len(set(drawn)) == len(drawn)
            assert all(q[tree.inner_nodes.index(parent), token] > 0 for token in drawn)


def test_llamagen_shapes():
    """Our B config has LlamaGen-B's parameter count (111M) and key names."""
    with torch.device("meta"):
        model = Transformer(CONFIGS["llamagen-b"])
    assert abs(parameter_count(model) - 111e6) < 1.5e6
    keys = set(model.state_dict())
    for key in ["tok_embeddings.weight", "cls_embedding.embedding_table.weight", "layers.0.attention.wqkv.weight",
                "layers.0.attention.wo.weight", "layers.0.feed_forward.w1.weight", "layers.11.ffn_norm.weight",
                "norm.weight", "output.weight"]:
        assert key in keys
    assert model.cls_embedding.embedding_table.weight.shape == (1001, 768)


def test_small_config_is_about_ten_million_parameters():
    with torch.device("meta"):
        assert 8e6 < parameter_count(Transformer(CONFIGS["small"])) < 12e6
        assert parameter_count(Drafter(CONFIGS["small"])) < parameter_count(Transformer(CONFIGS["small"])) / 5


def test_bfloat16_models_decode():
    """The CUDA path runs the models in bf16; the same dtype handling is exercised here on the CPU."""
    from coolsd.models.bundle import random_bundle

    bundle = random_bundle("tiny").to("cpu", torch.bfloat16)
    assert bundle.target.output.weight.dtype == torch.bfloat16
    for method, params in [("ar", {}), ("eagle", {}), ("cool", {"delta": 2.0}), ("lantern", {"k": 3})]:
        for spec in ("chain:4", "tree:eagle25"):
            result = named(bundle, 1, method, params, spec, SamplingConfig(cfg_scale=2.0), seed=0)
            assert len(result.tokens) == bundle.config.image_tokens
            assert all(0 <= t < bundle.config.vocab_size for t in result.tokens)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_is_llamagens_order_exactly(dtype):
    """Normalise in float32, cast back, then scale (LlamaGen); the one-call float32 form gives the same bits."""
    from coolsd.models.gpt import RMSNorm
    norm = RMSNorm(48, 1e-5).to(dtype)
    torch.nn.init.normal_(norm.weight)
    x = (torch.randn(3, 5, 48) * 7).to(dtype)
    want = torch.nn.functional.rms_norm(x.float(), (48,), eps=1e-5).type_as(x) * norm.weight
    assert torch.equal(norm(x), want)
