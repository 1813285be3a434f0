"""A synthetic stage of known duration, as `pipewright bench`'s: it sleeps, so the CPU is free.

Put it in a stage's module to measure PyTorch's runtime (and the recorder) against the
simulator with costs known in advance: `torch.nn.Sequential(layer, pwt.Sleep(2.0, 4.0))`
makes that stage's forward take at least 2 ms and its backward at least 4 ms.
"""

from __future__ import annotations

import time

import torch


class _SleepFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, forward_s, backward_s):
        ctx.backward_s = backward_s
        time.sleep(forward_s)
        return x.clone()  # a new tensor: PyTorch's runtime detaches stage outputs in place

    @staticmethod
    def backward(ctx, grad):
        time.sleep(ctx.backward_s)
        return grad, None, None


class Sleep(torch.nn.Module):
    """Identity that sleeps `forward_ms` in its forward and `backward_ms` in its backward."""

    def __init__(self, forward_ms: float, backward_ms: float | None = None):
        super().__init__()
        backward_ms = forward_ms if backward_ms is None else backward_ms
        if not (forward_ms >= 0 and backward_ms >= 0):
            raise ValueError(f"Sleep({forward_ms}, {backward_ms}): times must be at least 0 ms")
        self.forward_s, self.backward_s = forward_ms / 1e3, backward_ms / 1e3

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _SleepFn.apply(x, self.forward_s, self.backward_s)
