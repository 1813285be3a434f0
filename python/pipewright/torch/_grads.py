"""Put the stages' gradients back after steps that only measure (the split probe, tuning)."""

from __future__ import annotations


def save_grads(stages) -> list:
    """Each parameter of the stages with a copy of its gradient (or None)."""
    return [(p, None if p.grad is None else p.grad.detach().clone())
            for st in stages for p in st.submod.parameters()]


def restore_grads(saved: list) -> None:
    """Each parameter's gradient as `save_grads` found it."""
    for p, g in saved:
        if g is None:
            p.grad = None
        elif p.grad is None:
            p.grad = g
        else:
            p.grad.copy_(g)
