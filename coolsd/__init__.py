"""coolsd: speculative decoding for autoregressive image generation, lossless and relaxed (COOL-SD).

Packages: ``core`` (the decoding engine, acceptance rules, draft trees, theory; imports only torch and numpy),
``models`` (the model interface's implementations and loaders), ``toy`` (the shipped Fashion-MNIST model's
data, tokenizer, judge and training), ``app`` (the explorer's logic) and ``cli`` (``python -m coolsd.generate``,
``coolsd.bench``, ``coolsd.train``).
"""
