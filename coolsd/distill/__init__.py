"""A general Eagle-1 drafter trainer (``python -m coolsd.train drafter --model ... --out ...``).

It self-distils: the frozen target samples images for random conditions with its own sampling settings and
records its final-normed features (``data``); a new drafter learns to predict the next feature with Eagle's
objective as LANTERN trains it for LlamaGen (``objective``); the loop checkpoints and resumes exactly
(``trainer``); a measured cost estimate refuses runs that cannot fit (``cost``); the result is saved in a format
our loaders read (``heads``) with a model card of its measured quality (``report``). ``command`` is the command
line. It imports only :mod:`coolsd.core` and :mod:`coolsd.models`.
"""
