"""tensor_parallel=2 alone on 4 gloo ranks: 2 data-parallel replicas that nothing keeps in step.  `scalekit.run` in
each rank refuses it before anything is built, naming the numbers, however the ranks were started (here by
scalekit.launch of a function, which does not check the config itself)."""

from __future__ import annotations

import pytest

import scalekit
from scalekit.launch import LaunchError, launch
from tests.forking import no_process_left_behind  # noqa: F401 - the same deadline and cleanup here
from tests.helpers import tiny


def _run_tensor_parallel_alone():
    return scalekit.run(tiny(batch_size=8, steps=1, toggles={"tensor_parallel": 2}), catch_errors=True).status


def test_each_rank_refuses_tensor_parallel_replicas_that_nothing_keeps_in_step():
    with pytest.raises(LaunchError, match=r"tensor_parallel=2 on 4 ranks leaves 2 data-parallel replicas that nothing "
                                          r"keeps in step .*turn fsdp on too, or launch 2 ranks"):
        launch(_run_tensor_parallel_alone, nprocs=4, timeout_s=120)
