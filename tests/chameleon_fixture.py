"""A tiny Chameleon-family model directory in the official formats, written by the tests: a Hugging Face
Chameleon checkpoint saved by transformers itself (config.json with its vocabulary_map, sharded safetensors
and their index, the VQ encoder included), a tokenizer with the real special-token ids, a VQGAN ``.ckpt``
(weights under ``state_dict``, training leftovers beside them) with its ``.yaml``, a LANTERN drafter
directory, and a ``model.json``.

The vocabulary keeps Chameleon's layout: image tokens at 4..8195 named ``IMGIMG<code in letters>Z`` (codes
permuted, so an offset is not the mapping), ``<eoss>`` 8196, ``<racm3:break>`` 8197, ``<reservedNNNNN>`` at
id NNNNN + 4 up to 8831 (separator 8710, newline 8803, size tokens 8804 + n), then a few words."""

from __future__ import annotations

import json
from pathlib import Path

import torch

WORDS = ["Generate", "an", "image", "of", "64x64", "according", "to", "the", "following", "prompt", ":", "a",
         "photo", "red", "fox", "in", "snow", "bowl", "ramen", "lighthouse", "."]
VOCAB_SIZE = 8832 + 32
IMAGE_SIZE = 64  # 4 x 4 VQ codes


def image_code(token: int) -> int:
    """The code of image token ``token`` (4..8195) in the tiny vocabulary: a permutation, not an offset."""
    return (7 * (token - 4) + 3) % 8192


def code_name(code: int) -> str:
    return "IMGIMG" + "".join(chr(ord("A") + int(d)) for d in str(code)) + "Z"


def vocabulary() -> dict[str, int]:
    vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
    vocab.update({code_name(image_code(t)): t for t in range(4, 8196)})
    vocab.update({"<eoss>": 8196, "<racm3:break>": 8197})
    vocab.update({f"<reserved{t - 4:05d}>": t for t in range(8198, 8832)})
    vocab.update({word: 8832 + i for i, word in enumerate(WORDS)})
    return vocab


def write_tokenizer(folder: Path, vocab: dict[str, int]) -> None:
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.add_special_tokens([AddedToken(name, special=True) for name in ("<reserved08706>", "<s>", "</s>",
                                                                               "<pad>", "<unk>")])
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                   unk_token="<unk>")
    fast.save_pretrained(str(folder))


def hf_config(layers: int = 2, dim: int = 32, heads: int = 4, ffn: int = 64, rows: int = 1):
    from transformers import ChameleonConfig
    vq = {"embed_dim": 4, "num_embeddings": 16, "latent_channels": 4, "base_channels": 32,
          "channel_multiplier": [1, 1], "num_res_blocks": 1, "resolution": 32, "attn_resolutions": []}
    return ChameleonConfig(vocab_size=VOCAB_SIZE, hidden_size=dim, intermediate_size=ffn, num_hidden_layers=layers,
                           num_attention_heads=heads, num_key_value_heads=heads, max_position_embeddings=512,
                           vocabulary_map=vocabulary(), vq_config=vq, model_parallel_size=rows)


def reference_model(seed: int = 0, layers: int = 2, rows_shared: bool = False):
    """transformers' Chameleon with random weights (q/k norms random too); with ``rows_shared`` every head's
    q/k-norm row equal, as a checkpoint that stores one row would give after repeating it."""
    from transformers import ChameleonForConditionalGeneration
    torch.manual_seed(seed)
    model = ChameleonForConditionalGeneration(hf_config(layers)).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            for norm in (layer.self_attn.q_norm, layer.self_attn.k_norm):
                for p in (norm.weight, norm.bias):
                    p.copy_(torch.randn_like(p) * 0.5 + (1.0 if p is norm.weight else 0.0))
                    if rows_shared:
                        p.copy_(p[:1].expand_as(p))
            for norm in (layer.input_layernorm, layer.post_attention_layernorm):
                norm.weight.copy_(1 + 0.3 * torch.randn_like(norm.weight))
    return model


def write_model(folder: Path, seed: int = 0, layers: int = 2, one_row: bool = False):
    """Save the reference model as published (sharded safetensors + index); ``one_row``: q/k norms stored with
    one row (Lumina-mGPT's ``model_parallel_size`` 1 layout) instead of one per head. Returns the model."""
    from safetensors.torch import load_file, save_file
    model = reference_model(seed, layers, rows_shared=one_row)
    model.save_pretrained(str(folder), max_shard_size="300KB")
    if one_row:
        index = json.loads((folder / "model.safetensors.index.json").read_text())
        for shard in sorted(set(index["weight_map"].values())):
            state = load_file(str(folder / shard))
            state = {k: (v[:1].contiguous() if "_norm." in k and "self_attn" in k else v) for k, v in state.items()}
            save_file(state, str(folder / shard), metadata={"format": "pt"})
    write_tokenizer(folder, vocabulary())
    return model


# --- the VQGAN in the official checkpoint layout (taming's VQModel names) --------------------------------------

VQ_DDCONFIG = {"double_z": False, "z_channels": 4, "resolution": IMAGE_SIZE, "in_channels": 3, "out_ch": 3,
               "ch": 32, "ch_mult": [1, 1, 2, 2, 4], "num_res_blocks": 1, "attn_resolutions": [], "dropout": 0.0}
VQ_EMBED = 4


def vq_decoder_shapes(cfg: dict = VQ_DDCONFIG, n_embed: int = 8192, embed_dim: int = VQ_EMBED) -> dict[str, tuple]:
    """The decoder side's tensor names and shapes, written out from taming's Decoder layout."""
    shapes: dict[str, tuple] = {"quantize.embedding.weight": (n_embed, embed_dim),
                                "post_quant_conv.weight": (cfg["z_channels"], embed_dim, 1, 1),
                                "post_quant_conv.bias": (cfg["z_channels"],)}

    def conv(name, cin, cout, k):
        shapes[f"{name}.weight"], shapes[f"{name}.bias"] = (cout, cin, k, k), (cout,)

    def norm(name, c):
        shapes[f"{name}.weight"], shapes[f"{name}.bias"] = (c,), (c,)

    def resnet(name, cin, cout):
        norm(f"{name}.norm1", cin), conv(f"{name}.conv1", cin, cout, 3)
        norm(f"{name}.norm2", cout), conv(f"{name}.conv2", cout, cout, 3)
        if cin != cout:
            conv(f"{name}.nin_shortcut", cin, cout, 1)

    ch, mult = cfg["ch"], cfg["ch_mult"]
    block_in = ch * mult[-1]
    conv("decoder.conv_in", cfg["z_channels"], block_in, 3)
    resnet("decoder.mid.block_1", block_in, block_in)
    norm("decoder.mid.attn_1.norm", block_in)
    for part in "qkv":
        conv(f"decoder.mid.attn_1.{part}", block_in, block_in, 1)
    conv("decoder.mid.attn_1.proj_out", block_in, block_in, 1)
    resnet("decoder.mid.block_2", block_in, block_in)
    for level in reversed(range(len(mult))):
        for i in range(cfg["num_res_blocks"] + 1):
            resnet(f"decoder.up.{level}.block.{i}", block_in, ch * mult[level])
            block_in = ch * mult[level]
        if level:
            conv(f"decoder.up.{level}.upsample.conv", block_in, block_in, 3)
    norm("decoder.norm_out", block_in)
    conv("decoder.conv_out", block_in, cfg["out_ch"], 3)
    return shapes


class TrainingLeftover:
    """A non-tensor object in the checkpoint, as Lightning callbacks or hyper-parameter objects are."""

    def __init__(self) -> None:
        self.note = "not a tensor"


def vq_state(seed: int = 0) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    state = {}
    for name, shape in vq_decoder_shapes().items():
        scale = 1.0 if name.startswith("quantize") else (0.3 if name.endswith("bias") else 0.15)
        base = 1.0 if ".norm" in name and name.endswith("weight") else 0.0
        state[name] = base + scale * torch.randn(shape, generator=generator)
    # the encoder side and a training loss: present in the official file, not needed to decode
    state["encoder.conv_in.weight"] = torch.randn(32, 3, 3, 3, generator=generator)
    state["quant_conv.weight"] = torch.randn(VQ_EMBED, 4, 1, 1, generator=generator)
    state["loss.discriminator.main.0.weight"] = torch.randn(8, 3, 4, 4, generator=generator)
    return state


def write_vqgan(folder: Path, seed: int = 0, leftovers: bool = True) -> tuple[Path, Path]:
    import yaml
    folder.mkdir(parents=True, exist_ok=True)
    ckpt = {"state_dict": vq_state(seed), "global_step": 1234}
    if leftovers:
        ckpt["callbacks"] = {"checkpoint": TrainingLeftover()}
    torch.save(ckpt, folder / "vqgan.ckpt")
    config = {"model": {"target": "taming.models.vqgan.VQModel",
                        "params": {"embed_dim": VQ_EMBED, "n_embed": 8192, "ddconfig": VQ_DDCONFIG,
                                   "lossconfig": {"target": "taming.modules.losses.DummyLoss"}}}}
    (folder / "vqgan.yaml").write_text(yaml.safe_dump(config))
    return folder / "vqgan.ckpt", folder / "vqgan.yaml"


# --- a LANTERN drafter directory -------------------------------------------------------------------------------

def write_drafter(folder: Path, dim: int = 32, heads: int = 4, ffn: int = 64, rows: int = 1, seed: int = 0,
                  embed: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """LANTERN's layout (cnets_lumina_mgpt ``Model``, ``rows`` q/k-norm rows; cnets_anole: one per head):
    ``config.json`` (the target's config with one layer) and ``pytorch_model.bin``."""
    folder.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(seed)
    rnd = lambda *shape, s=0.1: s * torch.randn(*shape, generator=g)  # noqa: E731
    hd = dim // heads
    state = {"embed_tokens.weight": embed.clone() if embed is not None else rnd(VOCAB_SIZE, dim, s=1.0),
             "fc.weight": rnd(dim, 2 * dim), "fc.bias": rnd(dim)}
    for part in "qkvo":
        state[f"layers.0.self_attn.{part}_proj.weight"] = rnd(dim, dim, s=0.2)
    for part in "qk":
        state[f"layers.0.self_attn.{part}_norm.weight"] = 1 + rnd(rows, hd, s=0.3)
        state[f"layers.0.self_attn.{part}_norm.bias"] = rnd(rows, hd, s=0.3)
    state["layers.0.mlp.gate_proj.weight"] = rnd(ffn, dim, s=0.2)
    state["layers.0.mlp.up_proj.weight"] = rnd(ffn, dim, s=0.2)
    state["layers.0.mlp.down_proj.weight"] = rnd(dim, ffn, s=0.2)
    state["layers.0.input_layernorm.weight"] = 1 + rnd(dim)
    state["layers.0.post_attention_layernorm.weight"] = 1 + rnd(dim)
    config = {"architectures": ["ChameleonForConditionalGeneration"], "attention_bias": False, "hidden_act": "silu",
              "hidden_size": dim, "intermediate_size": ffn, "num_attention_heads": heads, "num_hidden_layers": 1,
              "num_key_value_heads": heads, "model_parallel_size": rows, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
              "vocab_size": VOCAB_SIZE, "mlp_bias": False, "swin_norm": False, "model_type": "chameleon"}
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    torch.save({k: v.to(torch.bfloat16) for k, v in state.items()}, folder / "pytorch_model.bin")
    return state


def build_model_dir(root: Path, layout: str = "lumina", drafter: bool = True, seed: int = 0) -> Path:
    """The whole tiny model directory with its ``model.json``."""
    root.mkdir(parents=True, exist_ok=True)
    model = write_model(root / "hf", seed)
    write_vqgan(root / "tokenizer", seed)
    spec = {"family": "chameleon", "name": f"tiny-chameleon-{layout}", "model": "hf",
            "vqgan": "tokenizer/vqgan.ckpt", "vqgan_config": "tokenizer/vqgan.yaml", "image_size": IMAGE_SIZE,
            "layout": layout, "prefix_slots": 40,
            "prompt_template": ("Generate an image of 64x64 according to the following prompt:\n{prompt}"
                                "<reserved08706>") if layout == "lumina" else "{prompt}",
            "sampling": {"cfg_scale": 3.0, "temperature": 1.0, "top_k": 2000, "top_p": 1.0}}
    if drafter:
        write_drafter(root / "drafter", embed=model.model.embed_tokens.weight.detach(), seed=seed + 1)
        spec["drafter"] = "drafter"
    (root / "model.json").write_text(json.dumps(spec, indent=2))
    return root
