"""The memory a run may use: the smaller of RAM and the cgroup's limit (v2 and v1, up the hierarchy), a GPU's free
memory; and the check that refuses a run planned past it by more than the planner's error, saying where the
limit comes from.  Read from fake /proc and /sys files, and once inside a real memory cgroup where one can be made."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import scalekit.plan
from scalekit import ConfigError, RunConfig, estimate
from scalekit.machine.memory_limit import (
    CGROUP_ROOT,
    PROC_ROOT,
    MemoryLimit,
    cgroup_limit,
    cgroup_paths,
    gpu_free_memory,
    machine_limit,
    read_limit_bytes,
)
from tests.helpers import CPU

GIB = 2**30
V1_NO_LIMIT = "9223372036854771712"  # what cgroup v1 writes for "unlimited" (4 KiB pages)


def fake_machine(tmp_path: Path, proc_cgroup: str, limits: dict[str, str]) -> tuple[Path, Path]:
    """A /proc whose self/cgroup reads `proc_cgroup`, and a /sys/fs/cgroup with each `limits` file (relative path:
    contents)."""
    proc, sys_cgroup = tmp_path / "proc", tmp_path / "cgroup"
    (proc / "self").mkdir(parents=True)
    (proc / "self" / "cgroup").write_text(proc_cgroup)
    sys_cgroup.mkdir()
    for relative, text in limits.items():
        (sys_cgroup / relative).parent.mkdir(parents=True, exist_ok=True)
        (sys_cgroup / relative).write_text(text + "\n")
    return proc, sys_cgroup


def test_limit_files_read_max_and_v1s_huge_value_as_no_limit(tmp_path):
    values = {"max": None, V1_NO_LIMIT: None, "1073741824": GIB, "garbage": None, "0": None}
    for i, (text, expected) in enumerate(values.items()):
        (tmp_path / str(i)).write_text(text + "\n")
        assert read_limit_bytes(tmp_path / str(i)) == expected, text
    assert read_limit_bytes(tmp_path / "missing") is None


def test_v2_walks_up_to_the_tightest_limit_of_the_hierarchy(tmp_path):
    proc, root = fake_machine(tmp_path, "0::/kubepods/pod7/ctr\n", {
        "kubepods/pod7/ctr/memory.max": "max",  # the container itself: no limit of its own
        "kubepods/pod7/memory.max": str(3 * GIB),  # its pod's limit binds it
        "kubepods/memory.max": str(20 * GIB)})
    limit = cgroup_limit(proc, root)
    assert limit.limit_bytes == 3 * GIB
    assert limit.source == f"the cgroup memory.max of {root / 'kubepods' / 'pod7'}"
    (root / "kubepods/pod7/ctr/memory.max").write_text(str(GIB))  # a tighter limit lower down wins
    assert cgroup_limit(proc, root).limit_bytes == GIB


def test_v1_reads_the_memory_controllers_mount_and_ignores_unlimited(tmp_path):
    proc, root = fake_machine(tmp_path, "5:cpu,cpuacct:/docker/abc\n4:memory:/docker/abc\n0::/\n", {
        "memory/docker/abc/memory.limit_in_bytes": V1_NO_LIMIT,
        "memory/docker/memory.limit_in_bytes": str(512 * 2**20),
        "memory/memory.limit_in_bytes": V1_NO_LIMIT})
    limit = cgroup_limit(proc, root)
    assert limit.limit_bytes == 512 * 2**20 and "memory.limit_in_bytes of" in limit.source
    (root / "memory/docker/memory.limit_in_bytes").write_text(V1_NO_LIMIT)
    assert cgroup_limit(proc, root) is None  # every level unlimited: no cgroup limit


def test_a_namespaced_container_reads_its_own_root_and_a_path_outside_it_too(tmp_path):
    # inside a cgroup namespace the container's cgroup is "/" and is mounted at /sys/fs/cgroup itself
    proc, root = fake_machine(tmp_path, "0::/\n", {"memory.max": str(GIB)})
    assert cgroup_limit(proc, root) == MemoryLimit(GIB, f"the cgroup memory.max of {root}")
    (proc / "self" / "cgroup").write_text("0::/../sibling\n")  # outside the namespace's view: only the mount's own
    assert cgroup_limit(proc, root).limit_bytes == GIB
    assert cgroup_paths(tmp_path / "nowhere") == [] and cgroup_limit(tmp_path / "nowhere", root) is None


def test_the_machines_limit_is_the_smaller_of_ram_and_the_cgroup(tmp_path):
    proc, root = fake_machine(tmp_path, "0::/job\n", {"job/memory.max": str(GIB)})
    host = dataclasses.replace(CPU, total_mem_bytes=8 * GIB)
    assert machine_limit(host, proc, root) == MemoryLimit(GIB, f"the cgroup memory.max of {root / 'job'}")
    (root / "job/memory.max").write_text(str(16 * GIB))  # a cgroup larger than the RAM: the RAM is the limit
    assert machine_limit(host, proc, root) == MemoryLimit(8 * GIB, "this machine's RAM")
    assert machine_limit(dataclasses.replace(host, total_mem_bytes=None), proc, root).limit_bytes == 16 * GIB


def test_a_gpus_limit_is_its_free_memory_and_cpu_torch_is_asked_nothing(monkeypatch):
    gpu = dataclasses.replace(CPU, device_type="cuda", device_index=0, device_name="H100", total_mem_bytes=80 * GIB)
    if not torch.cuda.is_available():  # a CPU build: CUDA calls raise, so the device's total is all that is known
        assert gpu_free_memory(0) is None
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # as if a driver answered, but torch cannot
        assert gpu_free_memory(0) is None
        assert machine_limit(gpu) == MemoryLimit(80 * GIB, "the memory of H100")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda index: (30 * GIB, 80 * GIB))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda index: 6 * GIB)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda index: 4 * GIB)
    limit = machine_limit(gpu)
    assert limit.limit_bytes == 32 * GIB and "cuda:0" in limit.source  # free + what torch holds cached, unused


# -- the check before a run ------------------------------------------------------------------------------------
def limited_to(monkeypatch, limit_bytes: int, source: str = "the cgroup memory.max of /sys/fs/cgroup/job") -> None:
    monkeypatch.setattr(scalekit.plan, "machine_limit", lambda hw: MemoryLimit(limit_bytes, source))


def test_the_margin_is_the_planners_error_not_twice_the_memory(monkeypatch):
    cfg = RunConfig(preset="small", batch_size=8, device="cpu").resolve(CPU)
    planned = estimate(cfg).peak_bytes
    limited_to(monkeypatch, int(planned / 1.05))  # 5% over: within the GPT plan's error, so it may fit
    assert scalekit.plan.check_fits(cfg, CPU) is None
    limited_to(monkeypatch, int(planned / 1.15))  # 15% over: accepted under the old 2×, refused now
    with pytest.raises(ConfigError, match=r"more than 1\.1× this machine's limit"):
        scalekit.plan.check_fits(cfg, CPU)
    assert scalekit.plan.ANALYTIC_MARGIN < scalekit.plan.TRACED_MARGIN <= 1.25


def test_a_refused_run_says_its_plan_the_limit_and_where_the_limit_comes_from(monkeypatch):
    cfg = RunConfig(preset="small", batch_size=64, seq_len=512, device="cpu").resolve(CPU)
    plan = estimate(cfg)
    limited_to(monkeypatch, GIB)
    with pytest.raises(ConfigError) as refused:
        scalekit.plan.check_fits(cfg, CPU)
    message = str(refused.value)
    assert message.startswith("RunConfig.check_memory: ")
    assert f"planned peak comes to {plan.peak_bytes / GIB:.1f} GiB (parameters {plan.params_bytes / GIB:.2f}" in message
    assert f"activations {plan.activations_bytes / GIB:.2f} GiB" in message
    assert "limit of 1.0 GiB (the cgroup memory.max of /sys/fs/cgroup/job;" in message
    assert "RunConfig.batch_size" in message and "check_memory=False" in message


# -- inside a real memory cgroup --------------------------------------------------------------------------------
@contextlib.contextmanager
def memory_cgroup(limit_bytes: int):
    """A fresh memory cgroup below this process's own, limited to `limit_bytes`: yields where the limit is written.
    Skips, saying why, where this process cannot make one (not root, no writable memory controller)."""
    if os.geteuid() != 0:
        pytest.skip("making a memory cgroup needs root")
    for controllers, path in cgroup_paths(PROC_ROOT):
        if controllers == "" and "memory" in _read(CGROUP_ROOT / "cgroup.controllers").split():
            mount, limit_file = CGROUP_ROOT, "memory.max"  # v2 (a child of the root: no processes of its own)
            parent = mount
        elif "memory" in controllers.split(","):
            mount, limit_file = CGROUP_ROOT / "memory", "memory.limit_in_bytes"  # v1
            parent = mount.joinpath(*Path(path).parts[1:])
        else:
            continue
        folder = parent / f"scalekit-test-{os.getpid()}"
        try:
            folder.mkdir()
            (folder / limit_file).write_text(str(limit_bytes))
        except OSError as exc:
            with contextlib.suppress(OSError):
                folder.rmdir()
            pytest.skip(f"cannot make a memory cgroup under {parent}: {exc}")
        try:
            yield folder / limit_file
        finally:
            folder.rmdir()  # empty again: its only process has exited
        return
    pytest.skip("no cgroup memory controller here (neither v2's cgroup.controllers nor a v1 memory mount lists it)")


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


INSIDE = """
import sys
open(sys.argv[1], "w").write("0")  # move this process into the cgroup before it allocates anything
import scalekit
from scalekit.machine.memory_limit import machine_limit
limit = machine_limit(scalekit.detect("cpu"))
print(limit.limit_bytes, limit.source, sep="\\n")
try:
    scalekit.run(scalekit.RunConfig(preset="small", batch_size=64, seq_len=512, device="cpu", steps=1))
except scalekit.ConfigError as exc:
    print(exc)
"""


def test_a_run_inside_a_1_gib_cgroup_is_refused_in_words_instead_of_killed():
    with memory_cgroup(GIB) as limit_file:
        done = subprocess.run([sys.executable, "-c", INSIDE, str(limit_file.with_name("cgroup.procs"))],
                              capture_output=True, text=True, timeout=120, cwd=Path(__file__).parents[2])
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])  # 137 would be the OOM killer
    limit_bytes, source, message = done.stdout.splitlines()[:3]
    where = f"the cgroup {limit_file.name} of {limit_file.parent}"
    assert (int(limit_bytes), source) == (GIB, where)
    assert message.startswith("RunConfig.check_memory: this run's planned peak comes to 2.1 GiB (parameters ")
    assert f"limit of 1.0 GiB ({where};" in message
