"""On GPU machines: fork-safe device probes, NCCL ranks (one per GPU), DeepSpeed where installed.

Each check runs in a fresh interpreter: the pytest process may already hold a CUDA context, and then
(rightly) the launcher refuses to fork it.  On a CPU machine conftest skips these with the reason.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import textwrap

import pytest

from tests.forking import no_process_left_behind  # noqa: F401 - deadline and cleanup


def run_python(code: str) -> dict:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=80)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.gpu
def test_counting_gpus_creates_no_cuda_context():
    out = run_python("""
        import json, torch, scalekit
        from scalekit.machine import hardware
        n = hardware.gpu_count_without_cuda_init()
        present = hardware.cuda_gpu_present()
        torch.cuda.is_available()  # NVML-based once scalekit is imported
        print(json.dumps({"n": n, "present": present, "initialised": torch.cuda.is_initialized()}))
    """)
    assert out["n"] >= 1 and out["present"] and not out["initialised"]


@pytest.mark.gpu
def test_forked_ranks_use_their_gpu():
    out = run_python("""
        import json, os, torch, scalekit

        def where():
            import torch.distributed as dist
            dist.init_process_group("nccl", device_id=torch.device("cuda", int(os.environ["LOCAL_RANK"])))
            t = torch.ones(1, device="cuda")
            dist.all_reduce(t)
            dist.destroy_process_group()
            return str(t.device), t.item()

        print(json.dumps(scalekit.launch(where, nprocs=1)))
    """)
    assert out == [["cuda:0", 1.0]]


@pytest.mark.multi_gpu
def test_ddp_and_fsdp_on_two_gpus_match_one_gpu():
    out = run_python("""
        import json
        from scalekit import RunConfig
        from scalekit.launch import launch_run
        common = dict(preset="tiny", batch_size=8, steps=4, warmup_steps=1, log_every=1, device="cuda")
        runs = {name: launch_run(RunConfig(**common, toggles=t), nprocs=n).losses
                for name, t, n in (("one", [], 1), ("ddp", ["ddp"], 2), ("fsdp", ["fsdp"], 2))}
        print(json.dumps(runs))
    """)
    for name in ("ddp", "fsdp"):
        assert [v for _, v in out[name]] == pytest.approx([v for _, v in out["one"]], abs=1e-3)


@pytest.mark.gpu
def test_deepspeed_zero_trains_like_plain_adamw():
    if importlib.util.find_spec("deepspeed") is None:
        pytest.skip("DeepSpeed is not installed: pip install 'scalekit[deepspeed]'")
    out = run_python("""
        import json
        from scalekit import RunConfig
        from scalekit.launch import launch_run
        common = dict(preset="tiny", batch_size=8, steps=4, warmup_steps=1, log_every=1, device="cuda")
        plain = launch_run(RunConfig(**common), nprocs=1)
        zero = launch_run(RunConfig(**common, toggles={"deepspeed": "zero2"}), nprocs=1)
        print(json.dumps({"status": zero.status, "error": zero.error, "plain": plain.losses, "zero": zero.losses}))
    """)
    assert out["status"] == "ok", out["error"]
    assert [v for _, v in out["zero"]] == pytest.approx([v for _, v in out["plain"]], abs=1e-2)
