"""`scalekit doctor`: the facts scalekit uses on this machine, and what works here."""

from __future__ import annotations

import contextlib
import io
import warnings

import torch

from ..optional import quiet_import
from ..toggles import ORDER
from . import cxx
from .hardware import Hardware, detect


def compile_works() -> tuple[bool, str]:
    """Compile and run a two-op function: the honest way to know torch.compile works here."""
    try:
        torch._dynamo.reset()
        fn = torch.compile(lambda x: torch.nn.functional.gelu(x) * 2 + 1)
        x = torch.randn(8, 8)
        ok = torch.allclose(fn(x), torch.nn.functional.gelu(x) * 2 + 1, atol=1e-6)
        return (True, "compiled and ran a test function") if ok else (False, "compiled code gave a wrong result")
    except Exception as exc:  # any failure is the answer
        return False, f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"


def bitsandbytes_works() -> tuple[bool, str]:
    """Import bitsandbytes and take one 8-bit AdamW step on this device."""
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()), \
                warnings.catch_warnings():
            warnings.simplefilter("ignore")
            bnb = quiet_import("bitsandbytes")

            p = torch.nn.Parameter(torch.randn(4096, device="cuda" if torch.cuda.is_available() else "cpu"))
            opt = bnb.optim.AdamW8bit([p], min_8bit_size=1)
            p.grad = torch.randn_like(p)
            opt.step()
            dtypes = {v.dtype for v in opt.state[p].values() if isinstance(v, torch.Tensor)}
        return True, f"bitsandbytes {bnb.__version__}: 8-bit AdamW step ran (state dtypes: " \
                     f"{', '.join(sorted(str(d).replace('torch.', '') for d in dtypes))})"
    except Exception as exc:
        return False, f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"


def facts(hw: Hardware | None = None, run_checks: bool = True) -> list[tuple[str, str]]:
    hw = hw or detect()
    mem = f"{hw.total_mem_bytes / 2**30:.1f} GiB" if hw.total_mem_bytes else "unknown"
    rows = [
        ("device", f"{hw.device_type}: {hw.device_name}"),
        ("compute capability", str(hw.capability) if hw.capability else "— (not a CUDA GPU)"),
        ("memory", mem + (" (GPU)" if hw.device_type == "cuda" else " (system RAM)")),
        ("CPU cores", str(hw.cpu_count)),
        ("torch", f"{hw.torch_version} (CUDA {hw.cuda_version})" if hw.cuda_version else f"{hw.torch_version} (CPU build)"),
        ("bf16", "supported" if hw.bf16_supported else "not supported"),
        ("tf32", "supported" if hw.tf32_supported else "not supported"),
    ]
    for dtype in ("fp32", "tf32", "bf16", "fp16"):
        peak, why = hw.peak_tflops(dtype)
        rows.append((f"peak {dtype} (for MFU)", f"{peak:g} TFLOP/s dense ({why})" if peak else f"n/a: {why}"))
    if run_checks:
        ok, why = compile_works()
        rows.append(("torch.compile", ("works: " if ok else "does not work: ") + why))
        rows.append(("C++ compiler (CPU kernels)", cxx.describe()))
        ok, why = bitsandbytes_works()
        rows.append(("bitsandbytes", ("works: " if ok else "does not work: ") + why))
    for toggle in ORDER:
        ok, why = toggle.available(hw)
        rows.append((f"toggle {toggle.name}", "available" if ok else f"unavailable: {why}"))
    return rows
