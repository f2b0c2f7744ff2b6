"""scalekit.launch: ranks from a function, their output, a failing rank, the guards, the rendezvous."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
import types

import psutil
import pytest
import torch
import torch.distributed as dist

import scalekit
from scalekit.errors import ConfigError
from scalekit.launch import ForkUnsafeError, LaunchError, launch, launch_run, torchrun_command
from scalekit.launch.agent import LoopbackStore
from tests.forking import no_process_left_behind  # noqa: F401 - deadline and cleanup
from tests.helpers import tiny


def _hello(x):
    dist.init_process_group("gloo")
    r = dist.get_rank()
    print(f"hello from {r}")
    total = torch.tensor([float(r + 1)])
    dist.all_reduce(total)
    return {"rank": r, "x": x, "sum": total.item(), "world": dist.get_world_size(), "pid": os.getpid(),
            "master": os.environ["MASTER_ADDR"]}


def test_launch_runs_ranks_returns_their_values_and_prefixes_their_output(capsys):
    out = scalekit.launch(_hello, 7, nprocs=2)  # the package is callable: scalekit.launch(fn, ...)
    assert [o["rank"] for o in out] == [0, 1]
    assert all(o["x"] == 7 and o["sum"] == 3.0 and o["world"] == 2 for o in out)  # they talked to each other
    assert len({o["pid"] for o in out} | {os.getpid()}) == 3  # two new processes
    assert all(o["master"] == "127.0.0.1" for o in out)
    printed = capsys.readouterr().out
    assert "[rank0]: hello from 0" in printed and "[rank1]: hello from 1" in printed


def test_scalekit_launch_is_both_the_function_and_the_package():
    import scalekit.launch.api as api_module

    assert callable(scalekit.launch) and scalekit.launch.api is api_module
    assert scalekit.launch.launch is launch and scalekit.launch.launch_run is launch_run


def _tensors(size):
    rank = int(os.environ["RANK"])
    return {"rank": rank, "small": torch.arange(3.0) * rank, "large": torch.full((size,), float(rank))}


def test_tensors_come_back_from_the_ranks():
    """A rank's value is pickled by the rank itself (rank.ReturnValue), with torch's pickler for tensors."""
    out = launch(_tensors, 1 << 20, nprocs=2)
    assert [o["rank"] for o in out] == [0, 1]
    assert out[1]["small"].tolist() == [0.0, 1.0, 2.0] and out[1]["large"].sum().item() == float(1 << 20)


def _fails_on_rank_1():
    dist.init_process_group("gloo")
    if dist.get_rank() == 1:
        raise ValueError("rank one broke")
    time.sleep(60)  # not in a collective: the launcher itself must stop this rank


def test_a_failing_rank_shows_its_traceback_stops_the_others_and_the_next_launch_works(capsys):
    t0 = time.monotonic()
    with pytest.raises(LaunchError) as info:
        launch(_fails_on_rank_1, nprocs=2)
    elapsed_s = time.monotonic() - t0
    assert elapsed_s < 10, f"the other rank took {elapsed_s:.1f} s to end"
    assert info.value.rank == 1
    assert "ValueError: rank one broke" in str(info.value)
    assert "_fails_on_rank_1" in info.value.rank_traceback and "raise ValueError" in info.value.rank_traceback
    assert "[rank1]: ValueError: rank one broke" in capsys.readouterr().err
    assert psutil.Process().children(recursive=True) == []
    assert [o["sum"] for o in launch(_hello, 1, nprocs=2)] == [3.0, 3.0]


def _crashes_on_rank_0():
    if int(os.environ["RANK"]) == 0:
        os._exit(3)  # no Python exception: like a crash in native code
    time.sleep(60)


def test_a_rank_that_dies_without_an_exception_is_reported_by_exit_code():
    t0 = time.monotonic()
    with pytest.raises(LaunchError, match="rank 0 ended with exit code 3 and no Python exception"):
        launch(_crashes_on_rank_0, nprocs=2)
    assert time.monotonic() - t0 < 10


def test_guard_cuda_already_initialised_is_refused_at_once(monkeypatch):
    # simulate it on CPU: what torch.cuda.is_initialized() reads once a CUDA context exists
    monkeypatch.setattr(torch.cuda, "_initialized", True)
    assert torch.cuda.is_initialized()
    t0 = time.monotonic()
    with pytest.raises(ForkUnsafeError) as info:
        launch(_hello, 1, nprocs=2)
    assert time.monotonic() - t0 < 2  # a message, never a hang
    text = str(info.value)
    assert "CUDA is already initialised" in text and "restart the kernel" in text and "%%torchrun" in text
    assert psutil.Process().children(recursive=True) == []


def test_guard_bitsandbytes_imported(monkeypatch):
    monkeypatch.setitem(sys.modules, "bitsandbytes", types.ModuleType("bitsandbytes"))
    with pytest.raises(ForkUnsafeError, match="bitsandbytes is already imported.*inside the launched function"):
        launch(_hello, 1, nprocs=2)


def test_guard_process_group_alive():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        with pytest.raises(ForkUnsafeError, match="process group is already alive.*destroy_process_group"):
            launch(_hello, 1, nprocs=2)
    finally:
        dist.destroy_process_group()


def _launches_again():
    return launch(_hello, 1, nprocs=2)


def test_guard_no_launch_from_inside_a_rank():
    with pytest.raises(LaunchError, match="already a launched rank"):
        launch(_launches_again, nprocs=2)


@pytest.mark.parametrize("nprocs", [0, -1, 1.5, True, "2"])
def test_bad_nprocs_is_a_config_error(nprocs):
    with pytest.raises(ConfigError, match="nprocs"):
        launch(_hello, 1, nprocs=nprocs)


def _store_listener():
    """The rendezvous store's listening address, seen from inside a rank."""
    port = int(os.environ["MASTER_PORT"])
    listening = [c.laddr for c in psutil.net_connections(kind="tcp")
                 if c.status == psutil.CONN_LISTEN and c.laddr.port == port]
    return [a.ip for a in listening], port


def test_rendezvous_listens_on_loopback_only_on_a_port_the_os_chose():
    (ips, port), _ = launch(_store_listener, nprocs=2)
    assert ips == ["127.0.0.1"] and port > 0


def test_loopback_store_gives_different_ports_to_simultaneous_launches():
    a, b = LoopbackStore(), LoopbackStore()
    try:
        assert a.port != b.port
    finally:
        a.close(), b.close()


TWO_LAUNCHES = textwrap.dedent("""
    import os, sys, time, json
    import torch, torch.distributed as dist
    import scalekit

    def work():
        dist.init_process_group("gloo")
        time.sleep(1.5)  # long enough for the two launches to overlap
        t = torch.ones(1); dist.all_reduce(t)
        return int(os.environ["MASTER_PORT"]), t.item()

    print(json.dumps(scalekit.launch(work, nprocs=2)))
""")


def test_two_launches_at_once_do_not_collide(tmp_path):
    script = tmp_path / "two.py"
    script.write_text(TWO_LAUNCHES)
    procs = [subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, cwd=os.getcwd()) for _ in range(2)]
    try:
        outs = [p.communicate(timeout=90) for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [0, 0], [o[1][-2000:] for o in outs]
    import json

    results = [json.loads(o[0].strip().splitlines()[-1]) for o in outs]
    assert all(sums == [2.0, 2.0] for sums in ([r[1] for r in res] for res in results))
    assert results[0][0][0] != results[1][0][0]  # each launch had its own port


def test_torchrun_command_for_a_config_and_for_several_nodes():
    cfg = tiny(toggles=["ddp"], batch_size=8)
    cmd = torchrun_command(cfg, nproc_per_node=2, nnodes=2, node_rank=1, rdzv_endpoint="10.0.0.1:29500")
    assert cmd[:6] == ["torchrun", "--nproc-per-node=2", "--nnodes=2", "--node-rank=1", "--rdzv-backend=static",
                       "--rdzv-endpoint=10.0.0.1:29500"]
    assert cmd[6:9] == ["-m", "scalekit.cli.main", "bench"]
    assert cmd[cmd.index("--toggle") + 1] == "ddp" and cmd[cmd.index("--batch-size") + 1] == "8"
    # the bench flags it prints parse back into the same configuration
    from scalekit.cli.main import _config, parser

    args = parser().parse_args(cmd[8:])
    assert _config(args, dict(args.toggle)) == cfg
    # every field a flag can carry is carried (they are derived from RunConfig's fields, as the flags are)
    other = tiny(toggles=["ddp"], batch_size=8, lr=0.01, eval_every=2, eval_batches=1, measure_memory=False,
                 check_memory=False, threads=1, peak_tflops=3.5)
    cmd = torchrun_command(other, nproc_per_node=2)
    args = parser().parse_args(cmd[cmd.index("scalekit.cli.main") + 1:])
    assert _config(args, dict(args.toggle)) == other
    with pytest.raises(ConfigError, match=r"RunConfig.adapter_targets has no `scalekit bench` flag"):
        torchrun_command(tiny(adapter_targets=("c_fc",)), nproc_per_node=2)
    one = torchrun_command("train.py", nproc_per_node=4, args=["--lr", "1e-3"])
    assert one == ["torchrun", "--nproc-per-node=4", "--rdzv-backend=c10d", "--rdzv-endpoint=127.0.0.1:0",
                   "--local-addr=127.0.0.1", "train.py", "--lr", "1e-3"]
    with pytest.raises(ConfigError, match="rdzv_endpoint must be HOST:PORT"):
        torchrun_command("train.py", nnodes=2)
    with pytest.raises(ConfigError, match="node_rank must be an integer from 0 to nnodes-1"):
        torchrun_command("train.py", nnodes=2, node_rank=2, rdzv_endpoint="h:1")


def test_toggles_that_need_ranks_say_how_to_launch():
    hw = scalekit.detect("cpu")
    for name in ("ddp", "fsdp", "cpu_offload", "deepspeed"):
        ok, why = scalekit.TOGGLES[name].available(hw)
        assert not ok and "world size 1" in why and "scalekit.launch(fn, nprocs=2)" in why
    with pytest.raises(scalekit.ToggleUnavailable, match="'ddp' is unavailable.*scalekit.launch"):
        scalekit.run(tiny(toggles=["ddp"]))
    with pytest.raises(ConfigError, match="'cpu_offload' needs 'fsdp'"):
        tiny(toggles=["cpu_offload"])
    with pytest.raises(ConfigError, match="'ddp' and 'fsdp' cannot be on together"):
        tiny(toggles=["ddp", "fsdp"])


def test_a_launched_run_of_several_ranks_gets_the_launchs_load(monkeypatch):
    # the aggregated result of several ranks carries no load of its own: launch_run measures it from this process,
    # so a comparison of launched runs on a busy machine reads "unreliable (machine busy)" (no ranks forked here)
    from scalekit.launch import api
    from scalekit.measure.load import MachineLoad
    from scalekit.training.results import RunResult

    busy = MachineLoad(other_cpu_cores=1.0, cores=2, wall_s=1.0)
    monkeypatch.setattr(api, "LoadMeter", lambda: types.SimpleNamespace(read=lambda: busy))
    ranks_result = RunResult(label="ddp", config={}, status="ok")
    monkeypatch.setattr(api, "launch", lambda *args, **kwargs: [ranks_result, ranks_result])
    assert launch_run(tiny(toggles=["ddp"]), nprocs=2).load is busy
    own = MachineLoad(other_cpu_cores=0.0, cores=2, wall_s=1.0)  # a rank that measured its own keeps it
    ranks_result.load = own
    assert launch_run(tiny(), nprocs=1).load is own
