"""Where the app's GPU work runs: in this process (a CPU, or a dedicated GPU), or on Hugging Face ZeroGPU, where a
GPU is attached only inside functions wrapped by ``spaces.GPU`` (each call in a forked worker, its arguments and
results pickled: :mod:`.gpu` is written for that). Handlers ask this adapter what they may do; they never ask
which platform they run on."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass

# Set on ZeroGPU Spaces. The `spaces` package is installed on every Space: that it imports says nothing.
ZERO_GPU_VARIABLE = "SPACES_ZERO_GPU"
ZERO_GPU_VALUES = ("1", "t", "true")  # as spaces (spaces/config.py) and Gradio (utils.is_zero_gpu_space) read it


def on_zero_gpu(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether this process runs on a ZeroGPU Space."""
    return environ.get(ZERO_GPU_VARIABLE, "").strip().lower() in ZERO_GPU_VALUES


@dataclass(frozen=True)
class Device:
    """The platform's rules for GPU work. ``zero_gpu``: work runs in ZeroGPU's worker, not in this process."""

    zero_gpu: bool = False

    @classmethod
    def detect(cls, environ: Mapping[str, str] = os.environ) -> Device:
        return cls(zero_gpu=on_zero_gpu(environ))

    @property
    def local(self) -> bool:
        """Whether GPU work may run outside a request in this process (warm-up, the start-up images); on ZeroGPU
        no CUDA work may run outside a ``spaces.GPU`` call."""
        return not self.zero_gpu

    def place(self, function: Callable, duration: Callable[..., int]) -> Callable:
        """``function`` as GPU work must be called here: as it is, or through ``spaces.GPU`` on ZeroGPU, asking
        for ``duration(*arguments)`` seconds of GPU per call."""
        if not self.zero_gpu:
            return function
        import spaces
        return spaces.GPU(duration=duration)(function)
