"""Small models and configs the tests share."""

from __future__ import annotations

import contextlib

import torch

from scalekit import RunConfig, build, detect

CPU = detect("cpu")


def tiny(**kwargs) -> RunConfig:
    """The tiny GPT on Shakespeare, few steps, on the CPU."""
    base = dict(preset="tiny", steps=6, warmup_steps=1, log_every=2, device="cpu")
    base.update(kwargs)
    return RunConfig(**base)


@contextlib.contextmanager
def built(cfg: RunConfig, hw=CPU):
    """A run's BuildContext (model, optimizer, step contexts), built as `run` would build it, without running."""
    cfg = cfg.resolve(hw)
    with contextlib.ExitStack() as stack:
        yield build(cfg, hw, stack)


def learns(result, drop: float = 0.3) -> bool:
    """The loss is finite everywhere and fell by at least `drop` nats from the first step to the last."""
    losses = [loss for _, loss in result.losses]
    finite = all(torch.isfinite(torch.tensor(losses)))
    return bool(finite and losses[-1] < losses[0] - drop)


class Regressor(torch.nn.Module):
    """Not a GPT: a two-layer MLP fitting y = sum(x)."""

    def __init__(self, width: int = 32):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(16, width), torch.nn.ReLU(), torch.nn.Linear(width, 1))

    def forward(self, x):
        return self.net(x).squeeze(-1)


def regression_batch(batch_size: int, device: torch.device):
    x = torch.randn(batch_size, 16, device=device)
    return x, x.sum(-1)


def mse_loss(model, batch):
    x, y = batch
    return torch.nn.functional.mse_loss(model(x), y)
