"""The memory a run may use here, and where that limit comes from.

The host's RAM is not the limit inside a container: Docker, Kubernetes, Binder and SLURM confine a process to a
memory cgroup, and a process past its cgroup's limit is killed by the kernel's OOM killer (exit 137, no message).
So on a CPU the limit is the smaller of the RAM and every memory limit on the way from this process's cgroup up
to the root (cgroup v2's memory.max, v1's memory.limit_in_bytes); on a GPU it is the device's free memory.
The /proc and /sys/fs/cgroup roots are parameters, so tests can point them at files of their own.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path, PurePosixPath

PROC_ROOT = Path("/proc")
CGROUP_ROOT = Path("/sys/fs/cgroup")
# cgroup v1 writes "no limit" as its largest page count in bytes (9223372036854771712 with 4 KiB pages); no
# machine has 2**60 bytes, so anything from there up is read as no limit
V1_UNLIMITED_BYTES = 2**60


@dataclass(frozen=True)
class MemoryLimit:
    limit_bytes: int
    source: str  # where the limit comes from, in words: "the cgroup memory.max of /sys/fs/cgroup/..."


def read_limit_bytes(path: Path) -> int | None:
    """A cgroup limit file's value in bytes, or None for no limit ("max", v1's huge value) or no readable file."""
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if text == "max":
        return None
    try:
        value = int(text)
    except ValueError:
        return None
    return value if 0 < value < V1_UNLIMITED_BYTES else None


def cgroup_paths(proc_root: Path = PROC_ROOT) -> list[tuple[str, str]]:
    """(controllers, path) of each line of /proc/self/cgroup: ("", path) is cgroup v2's unified hierarchy."""
    try:
        lines = (proc_root / "self" / "cgroup").read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        fields = line.split(":", 2)
        if len(fields) == 3:
            out.append((fields[1], fields[2]))
    return out


def limits_up_the_hierarchy(mount: Path, cgroup_path: str, file_name: str) -> list[MemoryLimit]:
    """The limit in `file_name` of the cgroup at `cgroup_path` under `mount` and of each of its parents, up to the
    mount itself: a parent's limit binds its children too."""
    parts = PurePosixPath(cgroup_path).parts[1:]  # without the leading "/"
    if ".." in parts:  # a cgroup outside this namespace's view: only the mount's own files can be read
        parts = ()
    found = []
    for depth in range(len(parts), -1, -1):
        folder = mount.joinpath(*parts[:depth])
        limit = read_limit_bytes(folder / file_name)
        if limit is not None:
            found.append(MemoryLimit(limit, f"the cgroup {file_name} of {folder}"))
    return found


def cgroup_limit(proc_root: Path = PROC_ROOT, cgroup_root: Path = CGROUP_ROOT) -> MemoryLimit | None:
    """The tightest memory limit of this process's cgroups, v2 and v1 alike (a hybrid machine has both), or None."""
    found = []
    for controllers, path in cgroup_paths(proc_root):
        if controllers == "":  # v2: one hierarchy, mounted at the root
            found += limits_up_the_hierarchy(cgroup_root, path, "memory.max")
        elif "memory" in controllers.split(","):  # v1: the memory controller's own mount
            found += limits_up_the_hierarchy(cgroup_root / "memory", path, "memory.limit_in_bytes")
    return min(found, key=lambda limit: limit.limit_bytes, default=None)


def gpu_free_memory(device_index: int | None) -> MemoryLimit | None:
    """What the GPU can still give this process: the driver's free memory plus the blocks torch's allocator holds
    cached but unused (a notebook's earlier run leaves them, and this run reuses them).  None without CUDA: a CPU
    build of torch raises on CUDA calls."""
    import torch

    if not torch.cuda.is_available():
        return None
    index = torch.cuda.current_device() if device_index is None else device_index
    try:
        free_bytes, _ = torch.cuda.mem_get_info(index)
        cached_bytes = torch.cuda.memory_reserved(index) - torch.cuda.memory_allocated(index)
    except (RuntimeError, AssertionError):  # "Torch not compiled with CUDA enabled", a driver error
        return None
    return MemoryLimit(free_bytes + cached_bytes,
                       f"the free memory of cuda:{index} (torch.cuda.mem_get_info, with torch's unused cache)")


def machine_limit(hw, proc_root: Path = PROC_ROOT, cgroup_root: Path = CGROUP_ROOT) -> MemoryLimit | None:
    """The most memory a run on `hw` (scalekit.machine.hardware.Hardware) may use, and where that figure comes from; None
    when nothing is known."""
    if hw.device_type == "cuda":
        found = [gpu_free_memory(hw.device_index)]
        if hw.total_mem_bytes:
            found.append(MemoryLimit(hw.total_mem_bytes, f"the memory of {hw.device_name}"))
    else:
        found = [cgroup_limit(proc_root, cgroup_root)]
        if hw.total_mem_bytes:
            found.append(MemoryLimit(hw.total_mem_bytes, "this machine's RAM"))
    return min((f for f in found if f is not None), key=lambda limit: limit.limit_bytes, default=None)
