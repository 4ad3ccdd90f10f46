"""coolsd: speculative decoding for autoregressive image generation, lossless and relaxed (COOL-SD)."""

from .bundle import Bundle, load_bundle, random_bundle
from .decode import Generation, generate
from .rules import AcceptanceRule, CoolSD, Eagle, Lantern, UniformRSD, omega_schedule
from .sampling import SamplingConfig
from .trees import DraftTree, chain, parse_draft

__all__ = ["AcceptanceRule", "Bundle", "CoolSD", "DraftTree", "Eagle", "Generation", "Lantern", "SamplingConfig",
           "UniformRSD", "chain", "generate", "load_bundle", "omega_schedule", "parse_draft", "random_bundle"]
