"""scalekit.distributed.collective_bench: the α-β fit recovers α and β from points made with them; the rings written
from sends give torch's collectives' results and send, per rank, the bytes the ring factors say (counted by
wrapping dist.isend) on 2 and 4 gloo ranks; the timing rows and the recorded calls of a rank."""

from __future__ import annotations

import math
import random

import pytest
import torch
import torch.distributed as dist

from scalekit.distributed import collective_bench as cb
from scalekit.launch import launch
from scalekit.predict.collectives import FACTORS
from tests.forking import no_process_left_behind  # noqa: F401 - the same deadline and cleanup here

SIZES = (2**10, 2**14, 2**18, 2**22, 2**24)


def _points(alpha, beta, noise=0.0, seed=0):
    rng = random.Random(seed)
    return [(s, (alpha + s / beta) * (1 + rng.uniform(-noise, noise))) for s in SIZES]


def test_the_fit_recovers_alpha_and_beta_from_exact_points():
    fit = cb.fit_alpha_beta(_points(40e-6, 2.5e9), "all_reduce")
    assert fit.alpha_s == pytest.approx(40e-6, rel=1e-9)
    assert fit.beta == pytest.approx(2.5e9, rel=1e-9)
    assert fit.worst_residual < 1e-9
    assert fit.time_s(2**20) == pytest.approx(40e-6 + 2**20 / 2.5e9)
    assert fit.bus_bandwidth(4) == pytest.approx(1.5 * 2.5e9)  # all-reduce's 2(n−1)/n


def test_the_fit_recovers_them_within_the_noise_and_shows_it_in_the_residuals():
    fit = cb.fit_alpha_beta(_points(100e-6, 1e9, noise=0.05, seed=3), "all_gather")
    assert fit.alpha_s == pytest.approx(100e-6, rel=0.1)
    assert fit.beta == pytest.approx(1e9, rel=0.1)
    assert 0 < fit.worst_residual <= 0.12
    assert len(fit.residuals) == len(SIZES)


def test_the_fit_keeps_alpha_and_beta_physical():
    flat = cb.fit_alpha_beta([(1e3, 2e-3), (1e6, 1e-3), (1e7, 1.5e-3)])  # no slope to speak of: β = ∞ or α ≥ 0
    assert flat.alpha_s >= 0 and flat.beta > 0
    through_zero = cb.fit_alpha_beta([(1e3, 1e-6), (1e6, 1e-3), (1e7, 1e-2)])  # a line through the origin
    assert through_zero.alpha_s == pytest.approx(0, abs=1e-12) and through_zero.beta == pytest.approx(1e9)
    bad = cb.fit_alpha_beta([(1e3, 1e-3), (1e6, 1e-4)])  # time falling with size: no bandwidth, α the mean
    assert bad.beta == math.inf and bad.alpha_s > 0
    with pytest.raises(ValueError, match="two points"):
        cb.fit_alpha_beta([(1e3, 1e-3)])


def test_the_ring_factors_are_predicts_with_all_to_all_added():
    for n in (2, 4, 8):
        for op in ("all_reduce", "all_gather", "reduce_scatter"):
            assert cb.RING_FACTORS[op](n) == FACTORS[op](n)
        assert cb.bytes_sent_per_rank("all_to_all", 800, n) == 800 * (n - 1) / n


def _rings():
    dist.init_process_group("gloo")
    n, r = dist.get_world_size(), dist.get_rank()
    out = {}
    try:
        torch.manual_seed(r)
        x = torch.randn(12 * n * 7)  # S = 336·n bytes: every chunk whole
        nbytes = x.numel() * 4
        theirs = {"all_reduce": x.clone(), "all_gather": torch.empty_like(x),
                  "reduce_scatter": torch.empty(x.numel() // n), "all_to_all": torch.empty_like(x)}
        shard = x[: x.numel() // n].clone()
        dist.all_reduce(theirs["all_reduce"])
        dist.all_gather_single(theirs["all_gather"], shard)
        dist.reduce_scatter_single(theirs["reduce_scatter"], x.clone())
        dist.all_to_all_single(theirs["all_to_all"], x)
        ours = {"all_reduce": lambda: cb.ring_all_reduce(x.clone()),
                "all_gather": lambda: cb.ring_all_gather(torch.empty_like(x), shard),
                "reduce_scatter": lambda: cb.ring_reduce_scatter(torch.empty(x.numel() // n), x),
                "all_to_all": lambda: cb.pairwise_all_to_all(torch.empty_like(x), x)}
        for op, fn in ours.items():
            with cb.counting_sends() as sent:
                mine = fn()
            out[op] = ((mine - theirs[op]).abs().max().item(), sent["bytes"], cb.bytes_sent_per_rank(op, nbytes, n))
        with cb.recording() as calls:
            dist.all_reduce(torch.ones(10))
            dist.all_gather_into_tensor(torch.ones(2 * n), torch.ones(2))  # the old spelling calls the new: once
            dist.reduce_scatter_single(torch.ones(3), torch.ones(3 * n))
        out["calls"] = list(calls)
        out["rows"] = cb.time_collectives((2**10, 2**12), repeats=2)
        out["replay_s"] = cb.replay(calls, repeats=2)
    finally:
        dist.destroy_process_group()
    return out


@pytest.mark.parametrize("ranks", [2, 4])
def test_the_rings_compute_what_torch_does_and_send_what_the_ring_factors_say(ranks):
    for rank, out in enumerate(launch(_rings, nprocs=ranks, timeout_s=120)):
        for op in cb.OPS:
            error, sent, formula = out[op]
            assert error < 1e-5, (op, rank, error)
            assert sent == formula, (op, rank, sent, formula)
        assert out["calls"] == [("all_reduce", 40), ("all_gather", 8 * ranks), ("reduce_scatter", 12 * ranks)]
        assert cb.by_op(out["calls"]) == {"all_reduce": 40, "all_gather": 8 * ranks, "reduce_scatter": 12 * ranks}
        assert out["replay_s"] > 0
        assert sorted((r["op"], r["bytes"]) for r in out["rows"]) == sorted(
            (op, s) for op in cb.OPS for s in (2**10, 2**12))
        assert all(0 < r["best_s"] <= r["seconds"] and len(r["all_s"]) == 2 for r in out["rows"])
