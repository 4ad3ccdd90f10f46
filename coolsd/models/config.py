"""One config type for every target shape and conditioning kind, and a table of named shapes (as gpt-fast's
``transformer_configs`` and LlamaGen's ``ModelArgs``): the prefix length is data, not a code path."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class ModelConfig:
    """Shape of a target model; the drafter reuses ``dim``, ``n_head`` and the vocabulary.

    ``caption_dim = 0``: a class-conditional model, prefix = one class token (``cls_token_num`` 1).
    ``caption_dim > 0``: a text-conditional model, prefix = ``cls_token_num`` caption slots of
    ``caption_dim``-d features with a padding mask (LlamaGen's text model: 120 slots of 2048-d FLAN-T5 features).
    """

    vocab_size: int = 1024
    dim: int = 256
    n_layer: int = 12
    n_head: int = 8
    num_classes: int = 10
    grid_height: int = 8
    grid_width: int = 8
    multiple_of: int = 256
    norm_eps: float = 1e-5
    rope_base: float = 10000.0
    class_dropout: float = 0.1
    cls_token_num: int = 1
    caption_dim: int = 0

    @property
    def image_tokens(self) -> int:
        return self.grid_height * self.grid_width

    @property
    def prefix_length(self) -> int:
        """``P``: conditioning positions before the first image token (image token i sits at ``P + i``)."""
        return self.cls_token_num

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_head

    @property
    def ffn_dim(self) -> int:
        """LlamaGen's SwiGLU width: 2/3 of 4*dim, rounded up to ``multiple_of``."""
        hidden = int(2 * 4 * self.dim / 3)
        return self.multiple_of * math.ceil(hidden / self.multiple_of)

    @property
    def null_class(self) -> int:
        """Index of the extra class-embedding row used as the "no class" input for guidance."""
        return self.num_classes

    @property
    def text_conditioned(self) -> bool:
        return self.caption_dim > 0

    def to_dict(self) -> dict:
        return asdict(self)

    def __post_init__(self) -> None:
        if self.dim % self.n_head or self.head_dim % 4:
            raise ValueError(f"dim={self.dim} must split into n_head={self.n_head} heads of a size divisible by 4")
        if self.cls_token_num < 1 or (not self.caption_dim and self.cls_token_num != 1):
            raise ValueError(f"cls_token_num={self.cls_token_num}: a class model has exactly 1 prefix token, a text "
                             "model (caption_dim > 0) at least 1")


# Shapes of LlamaGen's class-conditional models (256px, 16x16 grid, 16384 codes, 1000 classes), and ours.
CONFIGS: dict[str, ModelConfig] = {
    "tiny": ModelConfig(vocab_size=16, dim=32, n_layer=2, n_head=2, num_classes=4, grid_height=4, grid_width=4,
                        multiple_of=16),
    "small": ModelConfig(vocab_size=1024, dim=256, n_layer=12, n_head=8, num_classes=10, grid_height=16, grid_width=16),
    # The earlier default Fashion-MNIST target: 8x8 codes of a 512-entry codebook, 8 layers of width 192; its
    # one-layer drafter is 1/8 of it, so a CPU round cost about 3 AR steps (docs/performance.md).
    "fashion": ModelConfig(vocab_size=512, dim=192, n_layer=8, n_head=6, num_classes=10, grid_height=8, grid_width=8),
    # The shipped default target (coolsd.toy.train.TARGET_CONFIG): about the same size, deeper and narrower, so its
    # drafter layer is 1/32 of it (the paper's is 1/36 of LlamaGen-XL) and a CPU round costs fewer AR steps.
    "fashion-deep": ModelConfig(vocab_size=512, dim=96, n_layer=32, n_head=3, num_classes=10, grid_height=8,
                                grid_width=8),
    "llamagen-b": ModelConfig(vocab_size=16384, dim=768, n_layer=12, n_head=12, num_classes=1000,
                              grid_height=16, grid_width=16),
    "llamagen-l": ModelConfig(vocab_size=16384, dim=1024, n_layer=24, n_head=16, num_classes=1000,
                              grid_height=16, grid_width=16),
    "llamagen-xl": ModelConfig(vocab_size=16384, dim=1280, n_layer=36, n_head=20, num_classes=1000,
                               grid_height=16, grid_width=16),
    # LlamaGen-XL text-to-image, stage I: 120 caption slots of 2048-d FLAN-T5 features, 16x16 tokens.
    "llamagen-t2i-xl": ModelConfig(vocab_size=16384, dim=1280, n_layer=36, n_head=20, num_classes=1000,
                                   grid_height=16, grid_width=16, cls_token_num=120, caption_dim=2048),
}
# The shapes --random-init offers: tiny and small for tests and CPUs, the default model's shapes for comparing
# what a CPU round costs (bench --profile), the LlamaGen ones for profiling real shapes.
RANDOM_INIT_SIZES = ("tiny", "small", "fashion", "fashion-deep", "llamagen-b", "llamagen-l", "llamagen-xl",
                     "llamagen-t2i-xl")
