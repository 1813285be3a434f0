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


def check_grads(parts, *, reference=None, rtol: float = 1e-5, atol: float = 1e-8,
                zeros_are_lost: bool = True) -> None:
    """Refuse a step that left a trainable parameter without a gradient (or, with
    `reference`, a mapping from parameter name to the gradient of a fused-backward step,
    with one that differs from it), naming the parameter and its stage or model part.

    `parts`: this rank's `PipelineStage`s, or its model parts (modules, as torchtitan's
    `_pipeline_module_split` returns them), or one of either. Call it after the step,
    before the optimizer; parameters with `requires_grad=False` are skipped. With
    `reference` under FSDP, every data-parallel peer must call it (gradients are gathered).

    A gradient of exact zeros counts as lost (after `zero_grad(set_to_none=False)` that is
    what a lost one looks like), unless `reference` has the parameter (then the comparison
    decides) or `zeros_are_lost=False` (a model whose first step has legitimately zero
    gradients: a LoRA pair starting at zero, a gate initialised to zero). A `reference` that
    names none of the trainable parameters is refused: it would check nothing.
    """
    import torch

    from ._errors import GradError

    parts = [parts] if not isinstance(parts, (list, tuple)) else list(parts)
    missing, differ, unreferenced = [], [], []
    named = False  # whether `reference` names any parameter of the parts at all
    for i, part in enumerate(parts):
        module = getattr(part, "submod", part)
        index = getattr(part, "stage_index", None)
        where = f"stage {index}" if index is not None else f"model part {i}"
        if not isinstance(module, torch.nn.Module):
            raise GradError(f"{where} is a {type(part).__name__}, not a module or PipelineStage")
        for name, p in module.named_parameters():
            referenced = reference is not None and name in reference
            named = named or referenced
            if not p.requires_grad:
                continue
            local = p.grad is not None and not hasattr(p.grad, "full_tensor")
            zeros = local and zeros_are_lost and not referenced and not bool(torch.any(p.grad))
            if p.grad is None or zeros:
                missing.append(f"{name} ({where})")
            elif reference is not None and not referenced:
                unreferenced.append(f"{name} ({where})")
            elif referenced:
                # An FSDP gradient is a DTensor: gathered whole (a collective of the
                # data-parallel peers, which check the same parameters in the same order).
                got = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
                want = reference[name].to(got.device, got.dtype)
                if not torch.allclose(got, want, rtol=rtol, atol=atol):
                    err = (got - want).abs().max().item()
                    differ.append(f"{name} ({where}, max error {err:.3g})")
    if missing:
        raise GradError(
            f"no gradient (none, or all zeros) after the step for {', '.join(missing)}: an "
            "unused parameter, or, most often, a split-backward timetable (I/W) with a loss "
            "that runs part of the model itself (torchtitan's ChunkedLossWrapper); use a "
            "timetable without split backward (search --no-split-backward) or a plain loss "
            "(where all zeros is right, as for a LoRA pair starting at zero, pass "
            "zeros_are_lost=False)"
        )
    if unreferenced and not named:
        raise GradError(
            f"reference has no gradient for {', '.join(unreferenced)}: key it by the names "
            "module.named_parameters() gives on each stage or model part"
        )
    if differ:
        raise GradError(
            f"gradient differs from the fused-backward reference for {', '.join(differ)}: "
            "torchtitan's ChunkedLossWrapper under DualPipeV's overlapped F&B or a split "
            "backward does this; use a fused-backward timetable or a plain loss"
        )
