"""coolsd: speculative decoding for autoregressive image generation, lossless and relaxed (COOL-SD).

Packages: ``core`` (the decoding engine, acceptance rules and their registry, draft trees, theory; imports only
torch and numpy), ``models`` (targets, drafters, image decoders and their loaders), ``toy`` (the shipped
Fashion-MNIST model's data, tokenizer, judge and training), ``app`` (the explorer's logic; ``app.web``, the
Gradio app over it) and ``cli`` (``python -m coolsd.generate``, ``coolsd.bench``, ``coolsd.train``).
The names below are the library's API::

    bundle = coolsd.load_bundle()                       # the shipped model
    tree = coolsd.parse_draft("tree:eagle25")
    rule = coolsd.build_rule("cool", {"delta": 2}, tree.depth, bundle)
    image = bundle.image(coolsd.decode_image(bundle, 3, rule, tree, seed=0).tokens)
    images = coolsd.decode_images(bundle, [3, 3, 7], rule, tree, seeds=[0, 1, 2])  # one batch, lockstep rounds

``decode_image`` is :func:`coolsd.core.decode.generate` (its short name would clash with the
``coolsd.generate`` command-line module); ``decode_images`` is :func:`coolsd.core.decode.generate_batch`: image
``b`` of a batch gets the tokens it gets decoded alone with ``seeds[b]`` (spec section 9), several times faster
per image on a CPU.
"""

from .core.decode import Generation
from .core.decode import generate as decode_image
from .core.decode import generate_batch as decode_images
from .core.rules import (
           RULES,
           AcceptanceRule,
           CoolSD,
           Eagle,
           Lantern,
           RuleSpec,
           UniformRSD,
           build_rule,
           register,
)
from .core.sampling import SamplingConfig
from .core.trees import DraftTree, chain, parse_draft
from .models.bundle import Bundle, load_bundle, random_bundle
from .models.gpt import Caption, ClassLabel

__all__ = ["RULES", "AcceptanceRule", "Bundle", "Caption", "ClassLabel", "CoolSD", "DraftTree", "Eagle", "Generation",
           "Lantern", "RuleSpec", "SamplingConfig", "UniformRSD", "build_rule", "chain", "decode_image",
           "decode_images", "load_bundle", "parse_draft", "random_bundle", "register"]
