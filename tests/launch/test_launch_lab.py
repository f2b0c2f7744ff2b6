"""The Lab runs toggles that need several processes (ddp, fsdp) by launching ranks itself.

In tests/launch/: the suite runs these before anything imports bitsandbytes (conftest).
"""

from __future__ import annotations

import time

import torch.distributed as dist

from scalekit import Lab, detect
from tests.forking import no_process_left_behind  # noqa: F401 - deadline and cleanup
from tests.helpers import Regressor, mse_loss, regression_batch

WAIT_S = 120
LAUNCH_LIMIT_S = 60  # below WAIT_S: a rank that hangs fails the run, with the ranks named, instead of the wait


def test_lab_offers_ddp_and_runs_it_in_launched_ranks():
    lab = Lab(preset="tiny", steps=4, warmup_steps=1, log_every=2, device="cpu", hw=detect("cpu"))
    lab.launch_timeout_s = LAUNCH_LIMIT_S
    distributed = next(c for c in lab.controls.values() if "ddp" in c.names)
    assert "ddp" not in distributed.reasons and "fsdp" not in distributed.reasons  # launchable, so offered
    assert lab.processes in lab.widget.children[3].children  # the number of ranks is a control
    lab.start()
    single = lab.wait(WAIT_S)
    lab.select({"ddp": True})
    lab.processes.value = 2
    lab.start()
    ddp = lab.wait(WAIT_S)
    assert (single.status, ddp.status) == ("ok", "ok"), ddp.error
    assert ddp.config["toggles"] == {"ddp": True}
    assert list(lab.results["run"]) == ["baseline", "ddp"]
    assert lab.plots.trace_names("throughput") == ["#1 baseline", "#2 ddp"]
    # the same seed and the same global batch: two ranks with half each learn what one process learns
    assert ddp.final_loss == single.final_loss or abs(ddp.final_loss - single.final_loss) < 1e-4


def _hangs_on_rank_1(model, batch):
    if dist.get_rank() == 1:
        time.sleep(600)
    return mse_loss(model, batch)


def test_a_launched_run_that_hangs_ends_at_the_labs_time_limit_and_the_lab_is_ready_again():
    lab = Lab(model=Regressor, batch_fn=regression_batch, loss_fn=_hangs_on_rank_1, steps=4, batch_size=8,
              device="cpu", hw=detect("cpu"))
    assert lab.launch_timeout_s == 600  # the default, documented in the Lab's docstring
    lab.launch_timeout_s = 3
    lab.select({"ddp": True})
    lab.processes.value = 2
    t0 = time.monotonic()
    lab.start()
    result = lab.wait(WAIT_S)
    assert time.monotonic() - t0 < 3 + 30
    assert result.status == "failed"
    assert result.error.startswith("the launch reached its time limit of 3 s"), result.error
    assert "rank 1 was in _hangs_on_rank_1" in result.error
    assert "time limit of 3 s" in lab.message.value and "The Lab is ready for the next run" in lab.message.value
    assert not lab.running and not lab.run_button.disabled
