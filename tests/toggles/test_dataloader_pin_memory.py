"""Pinned memory and non_blocking copies: GPU toggles, unavailable on the CPU with the reason, their code paths
exercised on the CPU through a pretend GPU, and measured on a GPU where there is one."""

from __future__ import annotations

import dataclasses
import statistics
import time

import pytest
import torch

import scalekit.data.pipeline as pipeline
from scalekit import RunConfig, run
from scalekit.toggles import TOGGLES
from tests.helpers import COPY_TOGGLES, CPU, built, learns, tiny

PRETEND_GPU = dataclasses.replace(CPU, device_type="cuda", device_index=0, device_name="pretend GPU")
RAW = dict(data="shakespeare-raw", transform_rounds=1)  # the raw source: batches through a DataLoader


@pytest.mark.parametrize("name", COPY_TOGGLES)
def test_copy_toggles_are_unavailable_on_the_cpu_and_say_why(name):
    ok, why = TOGGLES[name].available(CPU)
    assert not ok and "CPU" in why and "GPU" in why
    assert TOGGLES[name].available(PRETEND_GPU) == (True, "")


def test_by_default_batches_are_copied_blocking_from_pageable_memory(spies):
    with built(tiny(**RAW)) as ctx:
        next(ctx.batches)
    assert "pin_memory" not in spies["loader_kwargs"][0] and spies["non_blocking"] == [False]


def test_pinned_memory_and_non_blocking_reach_the_loader_and_the_copy_cpu_proxy(spies):
    baseline = run(tiny(**RAW, steps=20, warmup_steps=1, log_every=5))
    both = run(tiny(**RAW, steps=20, warmup_steps=1, log_every=5, toggles=list(COPY_TOGGLES)))
    assert spies["loader_kwargs"][-1]["pin_memory"] is True
    assert spies["non_blocking"][-1] is True and spies["non_blocking"].count(True) >= 20
    assert both.status == "ok" and both.losses == baseline.losses  # the same batches, the same training
    assert learns(both)
    assert not any("non_blocking without pinned" in note for note in both.notes)


@pytest.mark.parametrize("name", COPY_TOGGLES)
def test_copy_toggles_say_when_they_change_nothing(spies, name):
    with built(tiny(data="synthetic", toggles=[name])) as ctx:
        assert any(name in note and "changes nothing" in note for note in ctx.notes)


@pytest.mark.gpu
def test_on_a_gpu_batches_arrive_pinned_and_copied_asynchronously(monkeypatch):
    pinned = []
    copy = pipeline.to_device

    def spy(batch, device, non_blocking=False):
        pinned.append(all(t.is_pinned() for t in batch))
        return copy(batch, device, non_blocking)

    monkeypatch.setattr(pipeline, "to_device", spy)
    result = run(RunConfig(preset="tiny", device="cuda", steps=20, warmup_steps=1, log_every=5, **RAW,
                           toggles=list(COPY_TOGGLES)))
    assert result.status == "ok" and learns(result) and all(pinned) and len(pinned) >= 20
    assert result.data_wait_ms is not None and result.data_wait_frac > 0


@pytest.mark.gpu
def test_on_a_gpu_a_loader_that_sleeps_is_measured_within_10_percent():
    took = []

    def batch_fn(batch_size, device):
        t0 = time.perf_counter()
        time.sleep(0.03)
        took.append((time.perf_counter() - t0) * 1e3)
        return torch.randn(batch_size, 16, device=device), torch.randn(batch_size, device=device)

    result = run(RunConfig(model=lambda: torch.nn.Linear(16, 1), batch_fn=batch_fn, batch_size=4,
                           loss_fn=lambda m, b: (m(b[0]).squeeze(-1) - b[1]).square().mean(), device="cuda",
                           steps=8, warmup_steps=1, log_every=4))
    assert result.data_wait_ms.median == pytest.approx(statistics.median(took[-8:]), rel=0.10)
