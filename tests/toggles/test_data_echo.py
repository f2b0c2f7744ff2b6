"""Data echoing: the pipeline is asked 1/k as often, and each batch it delivers is used for k steps."""

from __future__ import annotations

import time

import pytest
import torch

from scalekit import RunConfig, run
from scalekit.errors import ConfigError
from tests.helpers import Regressor, built, learns, mse_loss, tiny


class CountingBatches:
    """A batch_fn that counts its calls and can take a while, like a slow pipeline."""

    def __init__(self, sleep_s: float = 0.0):
        self.calls, self.sleep_s = 0, sleep_s

    def __call__(self, batch_size, device):
        self.calls += 1
        time.sleep(self.sleep_s)
        x = torch.randn(batch_size, 16, device=device)
        return x, x.sum(-1)


def own_model(source, k=None, **kwargs):
    return RunConfig(model=Regressor, batch_fn=source, loss_fn=mse_loss, batch_size=8, device="cpu",
                     measure_memory=False, toggles={"data_echo": k} if k else {}, **kwargs)


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_echo_k_asks_the_pipeline_one_kth_as_often_and_steps_k_times_per_batch(k):
    source = CountingBatches()
    result = run(own_model(source, k, steps=11, warmup_steps=1, log_every=3))  # 12 steps in all
    assert result.status == "ok" and len(result.steps) == 12
    # ceil(12 / k): a batch that was started is used; one more call before the run counted a step's FLOPs
    assert source.calls - 1 == result.batches_fetched == -(-12 // k)
    assert result.steps_per_batch == pytest.approx(12 / -(-12 // k))


def test_each_echoed_batch_is_the_fetched_one_k_times_then_the_next():
    with built(tiny(data="shakespeare-raw", transform_rounds=1)) as ctx:
        plain = [next(ctx.batches) for _ in range(3)]
    with built(tiny(data="shakespeare-raw", transform_rounds=1, toggles={"data_echo": 4})) as ctx:
        echoed = [next(ctx.batches) for _ in range(12)]
        assert ctx.batch_counter.count == 3
    for j, batch in enumerate(echoed):
        assert batch is echoed[j - j % 4]  # the same tensors, not a copy
        assert torch.equal(batch[0], plain[j // 4][0]) and torch.equal(batch[1], plain[j // 4][1])


def test_echo_takes_the_wait_off_the_steps_in_between():
    slow = run(own_model(CountingBatches(sleep_s=0.03), steps=8, warmup_steps=0, log_every=4))
    echoed = run(own_model(CountingBatches(sleep_s=0.03), 4, steps=8, warmup_steps=0, log_every=4))
    waits = [s.data_wait_ms for s in echoed.steps]
    assert all(w >= 30 for w in waits[::4]) and all(w < 30 for i, w in enumerate(waits) if i % 4)
    # the wait per step: one step in four waits for a batch (about a quarter of every step waiting; generous)
    per_step = sum(waits) / len(waits)
    assert per_step < 0.5 * sum(s.data_wait_ms for s in slow.steps) / len(slow.steps)
    assert echoed.steps_per_batch == 4 and slow.steps_per_batch == 1


def test_a_run_with_echo_still_learns():
    result = run(tiny(steps=24, warmup_steps=1, log_every=6, toggles={"data_echo": 2}))
    assert result.status == "ok" and learns(result), result.losses


@pytest.mark.parametrize("value", [0, -2, "x", 1.5])
def test_a_bad_echo_factor_is_refused_naming_the_field(value):
    with pytest.raises(ConfigError, match=r"RunConfig.toggles\['data_echo'\]"):
        RunConfig(toggles={"data_echo": value})
