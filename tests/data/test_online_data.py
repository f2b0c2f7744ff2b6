"""Online data: an environment stepped in Python, the same vectorized over environments and spread over worker
processes, give the same sequences; the side-by-side timing has a row for each."""

from __future__ import annotations

import itertools

import psutil
import pytest
import torch

from scalekit.data import online
from scalekit.data.pipeline import LoaderBatches


@pytest.mark.parametrize("seed,n,first,vocab", [(0, 1, 0, 65), (1337, 7, 0, 65), (2**62 + 3, 5, 10**9, 2),
                                                (5, 33, 123, 50257)])
def test_vectorized_rollouts_are_the_python_ones_token_for_token(seed, n, first, vocab):
    looped = online.rollouts_python(n, 40, seed, vocab, first_env=first)
    assert torch.equal(online.rollouts_vectorized(n, 40, seed, vocab, first_env=first), looped)
    assert looped.min() >= 0 and looped.max() < vocab
    assert (looped.diff(dim=1).abs() <= 1).all()  # a walk: one cell at most per step


@pytest.mark.filterwarnings("ignore:This DataLoader will create")  # 3 workers on a 2-core machine, on purpose
def test_rollouts_made_in_workers_come_in_order_and_the_workers_end():
    expected = [online.rollouts_vectorized(4, 17, 9, first_env=4 * b) for b in range(6)]
    for workers in (0, 2, 3):
        made = LoaderBatches(online.rollout_loader(4, 16, 9, num_workers=workers), torch.device("cpu"))
        try:
            got = list(itertools.islice(made, 6))
            pids = made.worker_pids()
            assert len(pids) == workers
        finally:
            made.close()
        for (x, y), tokens in zip(got, expected, strict=True):
            assert torch.equal(x, tokens[:, :-1]) and torch.equal(y, tokens[:, 1:])
        assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids)


def test_compare_generation_measures_the_three_ways_side_by_side():
    table = online.compare_generation(n_envs=32, length=17, workers=2, batches=2)
    assert len(table) == 3 and (table["sequences_per_s"] > 0).all() and table["speedup"].iloc[0] == 1
    assert table["first_batch_s"].iloc[2] > 0 and psutil.Process().children() == []
