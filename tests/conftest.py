"""Tests use tiny models: one torch thread each keeps per-op overhead low and lets pytest-xdist use the cores."""

import torch

torch.set_num_threads(1)
