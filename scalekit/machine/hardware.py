"""Facts about the machine, read without side effects.

Every CUDA call is behind `torch.cuda.is_available()`: on a CPU build those calls raise, and on a GPU
machine scalekit's launcher must be able to ask how many GPUs there are without creating a CUDA context
(`gpu_count_without_cuda_init`, which asks NVML through nvidia-smi).
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
from dataclasses import dataclass

import torch

from ..errors import ConfigError

# Dense (no structured sparsity) peak FLOP/s in TFLOP/s, from the vendors' data sheets.  Sparse figures
# are twice these and wrong for training.  First matching pattern wins, so specific names come first.
# A device that matches nothing gets no MFU ("n/a"), never a guess.
PEAK_DENSE_TFLOPS: tuple[tuple[str, dict[str, float]], ...] = (
    (r"h100.*pcie", {"bf16": 756, "fp16": 756, "tf32": 378, "fp32": 51}),
    (r"h100.*nvl", {"bf16": 835, "fp16": 835, "tf32": 418, "fp32": 60}),
    (r"h100|h200|gh200", {"bf16": 989, "fp16": 989, "tf32": 494, "fp32": 67}),  # SXM
    (r"a100", {"bf16": 312, "fp16": 312, "tf32": 156, "fp32": 19.5}),
    (r"l40s", {"bf16": 362, "fp16": 362, "tf32": 183, "fp32": 91.6}),
    (r"\bl4\b", {"bf16": 121, "fp16": 121, "tf32": 60, "fp32": 30.3}),
    (r"v100.*pcie", {"fp16": 112, "fp32": 14}),
    (r"v100", {"fp16": 125, "fp32": 15.7}),
    (r"\bt4\b", {"fp16": 65, "fp32": 8.1}),
    (r"rtx 4090", {"bf16": 165.2, "fp16": 165.2, "tf32": 82.6, "fp32": 82.6}),
)


@dataclass(frozen=True)
class Hardware:
    device_type: str  # "cpu" or "cuda"
    device_index: int | None
    device_name: str
    capability: tuple[int, int] | None  # CUDA compute capability
    bf16_supported: bool
    tf32_supported: bool
    total_mem_bytes: int | None
    cpu_count: int
    torch_version: str
    cuda_version: str | None

    @property
    def device(self) -> torch.device:
        return torch.device(self.device_type, self.device_index) if self.device_type == "cuda" else torch.device("cpu")

    def peak_tflops(self, dtype_key: str) -> tuple[float | None, str]:
        """Dense peak TFLOP/s for `dtype_key` ("fp32", "tf32", "bf16", "fp16"), or (None, why not)."""
        if self.device_type != "cuda":
            return None, f"no dense peak FLOP/s is known for CPU '{self.device_name}' (pass peak_tflops to set one)"
        name = self.device_name.lower()
        for pattern, table in PEAK_DENSE_TFLOPS:
            if re.search(pattern, name):
                if dtype_key in table:
                    return table[dtype_key], f"{self.device_name} dense {dtype_key} peak"
                return None, f"{self.device_name} has no {dtype_key} tensor-core peak in the table"
        return None, f"'{self.device_name}' is not in scalekit's peak FLOP/s table (pass peak_tflops to set one)"


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def detect(device: str = "auto", owner: str = "RunConfig") -> Hardware:
    """Describe the device runs will use: "auto" picks the first GPU if there is one, else the CPU.  `owner`
    is the config errors name (RunConfig, GenerateConfig)."""
    want_cuda = device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())
    common = dict(cpu_count=os.cpu_count() or 1, torch_version=torch.__version__, cuda_version=torch.version.cuda)
    if want_cuda:
        if not torch.cuda.is_available():
            build = f"built for CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
            raise ConfigError(f"{owner}.device: {device!r} was asked for, but torch sees no CUDA GPU here "
                              f"(torch {torch.__version__}, {build}); use 'cpu' or 'auto'")
        index = int(device.split(":", 1)[1]) if ":" in device else torch.cuda.current_device()
        if index >= torch.cuda.device_count():
            raise ConfigError(f"{owner}.device: {device!r}: this machine has {torch.cuda.device_count()} GPU(s), "
                              f"cuda:0 to cuda:{torch.cuda.device_count() - 1}")
        props = torch.cuda.get_device_properties(index)
        cap = (props.major, props.minor)
        return Hardware("cuda", index, props.name, cap, bf16_supported=cap >= (8, 0), tf32_supported=cap >= (8, 0),
                        total_mem_bytes=props.total_memory, **common)
    if device not in ("auto", "cpu"):
        raise ConfigError(f"{owner}.device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {device!r}")
    total = None
    try:
        import psutil

        total = psutil.virtual_memory().total
    except ImportError:
        pass
    return Hardware("cpu", None, _cpu_name(), None, bf16_supported=True, tf32_supported=False,
                    total_mem_bytes=total, **common)


def gpu_count_without_cuda_init() -> int:
    """Number of NVIDIA GPUs this process may use, asked of the driver (NVML, else nvidia-smi), so this
    process creates no CUDA context and stays safe to fork.  CUDA_VISIBLE_DEVICES narrows the count."""
    count = _nvml_gpu_count()
    if count is None:
        count = _nvidia_smi_gpu_count()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        listed = [d for d in visible.split(",") if d.strip() and not d.strip().startswith("-")]
        count = min(count, len(listed))
    return count


def _nvml_gpu_count() -> int | None:
    try:
        import pynvml  # nvidia-ml-py: the driver's own library, no CUDA context
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetCount())
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no driver, no GPU: NVML raises its own error types
        return None


def _nvidia_smi_gpu_count() -> int:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return 0
    try:
        out = subprocess.run([exe, "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=20, check=True).stdout
    except (subprocess.SubprocessError, OSError):
        return 0
    return len([line for line in out.splitlines() if line.strip()])


def cuda_gpu_present() -> bool:
    """A CUDA GPU that this torch build can use is present, found without initialising CUDA (fork-safe)."""
    return torch.backends.cuda.is_built() and gpu_count_without_cuda_init() > 0


def cuda_initialized() -> bool:
    """Whether this process has already created a CUDA context (which makes fork unsafe)."""
    return torch.cuda.is_initialized()
