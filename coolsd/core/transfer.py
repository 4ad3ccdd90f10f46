"""Host-to-device copies that do not wait for the GPU: a round's only synchronisation is its one read-back."""

from __future__ import annotations

import torch
from torch import Tensor


def to_device(host: Tensor, device: torch.device) -> Tensor:
    """A host tensor on ``device``. On CUDA it goes through pinned memory without blocking: a plain copy from
    pageable memory would wait for every queued kernel first."""
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


def index_tensor(values: list[int], device: torch.device) -> Tensor:
    """``values`` as a long tensor on ``device`` (see :func:`to_device`)."""
    return to_device(torch.tensor(values, dtype=torch.long), device)
