"""The Lab runs toggles that need several processes (ddp, fsdp) by launching ranks itself.

In a module named test_launch*: the suite runs these before anything imports bitsandbytes (conftest).
"""

from __future__ import annotations

from scalekit import Lab, detect


def test_lab_offers_ddp_and_runs_it_in_launched_ranks():
    lab = Lab(preset="tiny", steps=4, warmup_steps=1, log_every=2, device="cpu", hw=detect("cpu"))
    distributed = next(c for c in lab.controls.values() if "ddp" in c.names)
    assert "ddp" not in distributed.reasons and "fsdp" not in distributed.reasons  # launchable, so offered
    assert lab.processes in lab.widget.children[3].children  # the number of ranks is a control
    lab.start()
    single = lab.wait(120)
    lab.select({"ddp": True})
    lab.processes.value = 2
    lab.start()
    ddp = lab.wait(120)
    assert (single.status, ddp.status) == ("ok", "ok"), ddp.error
    assert ddp.config["toggles"] == {"ddp": True}
    assert list(lab.results["run"]) == ["baseline", "ddp"]
    assert lab.plots.trace_names("throughput") == ["#1 baseline", "#2 ddp"]
    # the same seed and the same global batch: two ranks with half each learn what one process learns
    assert ddp.final_loss == single.final_loss or abs(ddp.final_loss - single.final_loss) < 1e-4
