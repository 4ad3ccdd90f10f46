"""Tests use tiny models: one torch thread each keeps per-op overhead low and lets pytest-xdist use the cores.
Nothing may come from a model hub: every test runs offline."""

import os

import torch

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
torch.set_num_threads(1)
