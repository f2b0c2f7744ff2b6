"""The optimizer step a training run takes when no toggle owns it: backward of each micro-batch's loss, then the
update (with fp16's GradScaler where the run has one).  The training build sets it as BuildContext.stepper; a toggle
that owns the step (DeepSpeed) sets its own object with the same two methods instead."""

from __future__ import annotations

from typing import Any

import torch


class OptimizerStep:
    """The backward/step interface the training step calls: plain backward and optimizer.step(), or, with
    a GradScaler (fp16), the scaled loss's backward and the scaler's step and update."""

    def __init__(self, optimizer: torch.optim.Optimizer, grad_scaler: Any = None):
        self.optimizer = optimizer
        self.grad_scaler = grad_scaler

    def backward(self, loss: torch.Tensor, boundary: bool) -> None:
        """Backward of one micro-batch's loss; `boundary` marks the last micro-batch of the step."""
        (self.grad_scaler.scale(loss) if self.grad_scaler is not None else loss).backward()

    def step(self) -> None:
        """The optimizer update, then the gradients cleared (set to None: their memory is freed)."""
        if self.grad_scaler is not None:
            self.grad_scaler.step(self.optimizer)
            self.grad_scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
