"""Counting a model's FLOPs (one forward and backward) leaves its training untouched: no gradient in `.grad` and no
gradient hook fired, where a wrapper's hooks act on what they see (DeepSpeed's ZeRO reduces each gradient from one,
and a count's gradients, queued there, made its first step reduce them twice)."""

from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint

from scalekit.measure.flops import counted_train_flops


class TwoLinears(torch.nn.Module):
    def __init__(self, reentrant: bool | None = None):
        super().__init__()
        self.emb, self.first, self.second = torch.nn.Embedding(10, 8), torch.nn.Linear(8, 8), torch.nn.Linear(8, 1)
        self.reentrant = reentrant  # None: no checkpointing

    def forward(self, idx):
        x = self.emb(idx)
        x = self.first(x) if self.reentrant is None else checkpoint(self.first, x, use_reentrant=self.reentrant)
        return self.second(x).sum()


def count_with_hooks(model, params) -> tuple[int, int]:
    """The FLOPs counted, and how many post-accumulate-grad hooks fired during the count."""
    fired = []
    handles = [p.register_post_accumulate_grad_hook(fired.append) for p in model.parameters()]
    idx = torch.arange(6).view(2, 3)
    flops = counted_train_flops(lambda: model(idx), params)
    for handle in handles:
        handle.remove()
    return flops, len(fired)


def test_a_count_given_the_parameters_fires_no_gradient_hook_and_counts_the_same():
    torch.manual_seed(0)
    for reentrant in (None, False):
        model = TwoLinears(reentrant)
        plain, fired_plain = count_with_hooks(model, None)
        model.zero_grad(set_to_none=True)
        flops, fired = count_with_hooks(model, list(model.parameters()))
        assert fired_plain == len(list(model.parameters())) and fired == 0, reentrant
        assert all(p.grad is None for p in model.parameters()), reentrant
        assert flops == plain > 0, reentrant  # the weight gradients' matmuls counted all the same


def test_a_model_checkpointing_the_reentrant_way_is_counted_with_a_plain_backward():
    model = TwoLinears(reentrant=True)  # torch refuses autograd.grad through it
    flops, fired = count_with_hooks(model, list(model.parameters()))
    model.zero_grad(set_to_none=True)
    assert flops == count_with_hooks(model, None)[0] > 0
    assert fired == len(list(model.parameters()))  # its gradients were accumulated: the caller clears them (training.flops_per_step does)
