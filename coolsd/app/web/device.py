"""Where the app's GPU work runs: in this process (a CPU, or a dedicated GPU), or on Hugging Face ZeroGPU, where a
GPU is attached only inside functions wrapped by ``spaces.GPU`` (each call in a forked worker, its arguments and
results pickled). Handlers ask this adapter what they may do; they never ask which platform they run on."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

GPU_SECONDS = 60  # the GPU time one ZeroGPU call requests


@dataclass(frozen=True)
class Device:
    """The platform's rules for GPU work. ``zero_gpu``: work runs in ZeroGPU's worker, not in this process."""

    zero_gpu: bool = False

    @classmethod
    def detect(cls) -> Device:
        """ZeroGPU whenever the ``spaces`` package can be imported."""
        try:
            import spaces  # noqa: F401
        except ImportError:
            return cls(zero_gpu=False)
        return cls(zero_gpu=True)

    @property
    def local(self) -> bool:
        """Whether GPU work runs in this process: only then can it stream pictures, be stopped, report progress,
        and run before a request (warm-up, the start-up images); on ZeroGPU its arguments are pickled and no CUDA
        work may run outside a request."""
        return not self.zero_gpu

    def place(self, function: Callable) -> Callable:
        """``function`` as GPU work must be called here: as it is, or through ``spaces.GPU`` on ZeroGPU."""
        if not self.zero_gpu:
            return function
        import spaces
        return spaces.GPU(duration=GPU_SECONDS)(function)
