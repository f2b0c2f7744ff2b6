"""Rooflines: each operator of a step placed between a machine's compute peak and its memory bandwidth.

An operator that does F FLOPs and moves B bytes has the arithmetic intensity I = F / B (FLOPs per byte).  On a
machine of peak P FLOP/s and bandwidth W bytes/s it can reach at most min(P, I·W) FLOP/s (Williams, Waterman
and Patterson, "Roofline", CACM 2009): below the ridge point I = P / W it waits on memory, above it on the
arithmetic units.  A third limit the roofline does not draw: an operator whose ideal time, max(F / P, B / W),
is shorter than what launching one costs is bound by that overhead (small models live there).

`OpCounter` (a TorchDispatchMode) sees every aten operator a step runs, forward, backward and optimizer, below
autograd and autocast, and records for each:
- FLOPs: torch's own formulas where it has one (`torch.utils.flop_counter`: matmuls, convolutions, attention;
  it counts 2·m·k·n for a matmul and leaves a bias add out), the CPU attention kernel's through the same
  formulas, a layer norm as `LAYER_NORM_FLOPS` per element and a softmax as `SOFTMAX_FLOPS`, data movement
  (copies, casts, gathers, fills) as none, and every other operator one FLOP per element of its largest tensor
  (an element-wise op's count, a `_foreach_` op's over every tensor of its list; what sits below one FLOP per
  byte stays there whatever the exact count);
- bytes: what it reads and writes, each tensor argument and result once, at its dtype (a broadcast dimension,
  stride 0, read once; the tensors an in-place update returns nothing of, written); a view moves nothing and is
  not recorded;
- time: the wall time of the call (a CPU runs an operator before it returns), per step.
Operators are grouped by name, input shapes and dtype.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from .load import LoadMeter, MachineLoad
from .session import pin_threads

LAYER_NORM_FLOPS = 8  # per element: mean 1, variance 3 (subtract, square, add), normalise 2, scale and shift 2
SOFTMAX_FLOPS = 5  # per element: max, subtract, exp, sum, divide
MOVES = {"copy_", "_to_copy", "clone", "embedding", "index_select", "cat", "stack", "fill_", "zero_", "zeros",
         "zeros_like", "empty", "empty_like", "ones", "ones_like", "full", "full_like", "new_zeros", "new_empty",
         "new_ones", "new_full", "scalar_tensor", "arange", "_unsafe_view", "contiguous", "_foreach_copy_",
         "gather", "slice_backward", "select_backward", "lift_fresh", "_local_scalar_dense", "empty_strided",
         "constant_pad_nd", "tril", "triu", "masked_fill"}


@dataclass(frozen=True)
class Roof:
    """A machine's roofline: its peak FLOP/s (for one dtype) and its memory bandwidth (bytes/s)."""

    name: str
    peak_flops: float
    bandwidth: float

    @property
    def ridge(self) -> float:
        """The intensity (FLOPs per byte) above which an operator can be compute-bound: peak / bandwidth."""
        return self.peak_flops / self.bandwidth

    def attainable(self, intensity: float) -> float:
        """The most FLOP/s an operator of this intensity can reach here: min(peak, intensity × bandwidth)."""
        return min(self.peak_flops, intensity * self.bandwidth)

    def time_s(self, flops: float, nbytes: float) -> float:
        """The roofline's time for an operator: the longer of its arithmetic and its memory traffic."""
        return max(flops / self.peak_flops, nbytes / self.bandwidth)


@dataclass(frozen=True)
class OpCost:
    """One operator (by name, input shapes and dtype) over a step: calls, FLOPs, bytes and seconds per step."""

    op: str
    shapes: str
    dtype: str
    calls: float
    flops: float
    nbytes: float
    time_s: float

    @property
    def intensity(self) -> float:
        """FLOPs per byte moved."""
        return self.flops / self.nbytes if self.nbytes else math.inf

    @property
    def flops_per_s(self) -> float:
        """The FLOP/s it achieved (measured) or would reach (predicted)."""
        return self.flops / self.time_s if self.time_s else 0.0

    @property
    def label(self) -> str:
        return f"{self.op}({self.shapes}) {self.dtype}"

    def bound(self, roof: Roof, overhead_s: float = 0.0) -> str:
        """'overhead' when its roofline time per call is under `overhead_s` (the cost of launching one operator),
        else 'compute' at or above the ridge point, else 'memory'; 'data movement' when it does no arithmetic."""
        if not self.flops:
            return "data movement"
        if roof.time_s(self.flops, self.nbytes) / max(self.calls, 1) < overhead_s:
            return "overhead"
        return "compute" if self.intensity >= roof.ridge else "memory"


# -- the formulas, for one call ----------------------------------------------------------------------------
def matmul_flops(m: int, k: int, n: int) -> int:
    """(m, k) @ (k, n): a multiply and an add per term."""
    return 2 * m * k * n


def matmul_bytes(m: int, k: int, n: int, itemsize: int) -> int:
    """(m, k) @ (k, n): both inputs read once, the output written once."""
    return (m * k + k * n + m * n) * itemsize


def linear_flops(tokens: int, d_in: int, d_out: int) -> int:
    """nn.Linear on `tokens` rows: its matmul (the bias add is left out, as torch's counter leaves it)."""
    return matmul_flops(tokens, d_in, d_out)


def linear_bytes(tokens: int, d_in: int, d_out: int, itemsize: int, bias: bool = True) -> int:
    """nn.Linear on `tokens` rows: input, weight and bias read, output written."""
    return matmul_bytes(tokens, d_in, d_out, itemsize) + (d_out * itemsize if bias else 0)


def matmul_intensity(tokens: int, d_in: int, d_out: int, itemsize: int) -> float:
    """FLOPs per byte of a (tokens, d_in) @ (d_in, d_out) matmul: tokens·d_in·d_out / (itemsize/2 · the three
    tensors' elements); for d_in = d_out = d ≫ tokens in bf16 about `tokens` (How to Scale Your Model, ch. 1)."""
    return matmul_flops(tokens, d_in, d_out) / matmul_bytes(tokens, d_in, d_out, itemsize)


def compute_bound_tokens(d_in: int, d_out: int, ridge: float, itemsize: int) -> int | None:
    """The fewest tokens (rows) at which a (tokens, d_in) @ (d_in, d_out) matmul reaches `ridge` FLOPs per byte,
    or None when no batch does: 2·t·k·n ≥ R·e·(t·k + k·n + t·n) gives t ≥ R·e·k·n / (2·k·n − R·e·(k + n)),
    which needs 2·k·n > R·e·(k + n) (the activations read and written grow with t as fast as the FLOPs)."""
    k, n, e = d_in, d_out, itemsize
    room = 2 * k * n - ridge * e * (k + n)
    if room <= 0:
        return None
    return math.ceil(ridge * e * k * n / room)


def layer_norm_flops(rows: int, width: int) -> int:
    return LAYER_NORM_FLOPS * rows * width


def layer_norm_bytes(rows: int, width: int, itemsize: int, stats_itemsize: int = 4) -> int:
    """aten.native_layer_norm: reads x, weight and bias, writes y and the mean and 1/std of each row."""
    return (2 * rows * width + 2 * width) * itemsize + 2 * rows * stats_itemsize


def tensor_bytes(t: torch.Tensor) -> int:
    """The bytes a kernel reads or writes for `t`: its distinct elements (a broadcast, stride-0, dimension once)."""
    distinct = math.prod(s for s, st in zip(t.shape, t.stride(), strict=True) if st != 0)
    return distinct * t.element_size()


# -- counting a step ---------------------------------------------------------------------------------------
def _tensors(tree) -> list[torch.Tensor]:
    return [x for x in tree_leaves(tree) if isinstance(x, torch.Tensor)]


def _shapes(args) -> str:
    out = []
    for a in args:
        if isinstance(a, torch.Tensor):
            out.append("×".join(map(str, a.shape)) or "scalar")
        elif isinstance(a, list | tuple) and a and all(isinstance(x, torch.Tensor) for x in a):
            out.append(f"[{len(a)} tensors]")
    return ", ".join(out)


def _written_in_place(func, args) -> list[torch.Tensor]:
    """The tensors an operator that returns nothing writes into (a `_foreach_..._` update of a list)."""
    schema = func._schema.arguments
    return [t for arg, value in zip(schema, args, strict=False)
            if arg.alias_info is not None and arg.alias_info.is_write for t in _tensors(value)]


def _cpu_attention(args, kwargs, out):
    from torch.utils.flop_counter import sdpa_flop_count

    q, k, v = args[:3]
    return sdpa_flop_count(q.shape, k.shape, v.shape)


def _cpu_attention_backward(args, kwargs, out):
    from torch.utils.flop_counter import sdpa_backward_flop_count

    grad, q, k, v = args[:4]
    return sdpa_backward_flop_count(grad.shape, q.shape, k.shape, v.shape)


EXTRA_FORMULAS = {"_scaled_dot_product_flash_attention_for_cpu": _cpu_attention,
                  "_scaled_dot_product_flash_attention_for_cpu_backward": _cpu_attention_backward}


def op_flops(func, args, kwargs, out) -> int:
    """FLOPs of one call of aten operator `func` (see the module's docstring for the rules)."""
    from torch.utils.flop_counter import flop_registry

    name = func.__name__.split(".")[0]
    packet = getattr(func, "_overloadpacket", None)
    if packet in flop_registry:
        return int(flop_registry[packet](*args, **kwargs, out_val=out))
    if name in EXTRA_FORMULAS:
        return int(EXTRA_FORMULAS[name](args, kwargs, out))
    if name in MOVES:
        return 0
    lists = [a for a in args if isinstance(a, list | tuple) and a and isinstance(a[0], torch.Tensor)]
    if lists:  # a _foreach_ operator: element-wise over every tensor of its list
        largest = sum(t.numel() for t in lists[0])
    else:
        largest = max((t.numel() for t in _tensors((args, kwargs, out))), default=0)
    per_element = {"native_layer_norm": LAYER_NORM_FLOPS, "_softmax": SOFTMAX_FLOPS,
                   "_log_softmax": SOFTMAX_FLOPS}.get(name, 1)
    return per_element * largest


class OpCounter(TorchDispatchMode):
    """Records every aten operator run inside it (views aside): calls, FLOPs, bytes and wall time, summed by
    operator, input shapes and dtype.  `costs(steps)` divides by the steps it saw.  With `synchronize` (a GPU's
    operators return before they run) each operator is timed from an idle device to an idle device."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter, synchronize: Callable[[], None] | None = None):
        super().__init__()
        self.clock, self.synchronize = clock, synchronize
        self.totals: dict[tuple[str, str, str], list[float]] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.synchronize:
            self.synchronize()
        t0 = self.clock()
        out = func(*args, **kwargs)
        if self.synchronize:
            self.synchronize()
        seconds = self.clock() - t0
        if not func.is_view:
            self._record(func, args, kwargs, out, seconds)
        return out

    def _record(self, func, args, kwargs, out, seconds: float) -> None:
        inputs = _tensors((args, kwargs))
        dtype = str(inputs[0].dtype).removeprefix("torch.") if inputs else ""
        key = (func.__name__.split(".")[0], _shapes(args), dtype)
        written = _tensors(out) or _written_in_place(func, args)
        nbytes = sum(tensor_bytes(t) for t in inputs + written)
        row = self.totals.setdefault(key, [0, 0, 0, 0.0])
        row[0] += 1
        row[1] += op_flops(func, args, kwargs, out)
        row[2] += nbytes
        row[3] += seconds

    def costs(self, steps: int = 1) -> list[OpCost]:
        """Per step, longest first."""
        rows = [OpCost(op, shapes, dtype, calls / steps, flops / steps, nbytes / steps, seconds / steps)
                for (op, shapes, dtype), (calls, flops, nbytes, seconds) in self.totals.items()]
        return sorted(rows, key=lambda r: -r.time_s)


@dataclass(frozen=True)
class StepOps:
    """What `count_step` saw: the operators of one step (longest first), the threads it computed on, and the
    machine's load meanwhile (other processes' CPU: a busy machine makes every time here unreliable)."""

    ops: list[OpCost]
    threads: int
    load: MachineLoad

    @property
    def busy(self) -> bool:
        return self.load.busy


def count_step(step: Callable[[], object], steps: int = 3, warmup: int = 1, threads: int | None = None,
               device: str = "cpu") -> StepOps:
    """Every operator of `step()` (forward, backward, optimizer: whatever it runs) with its FLOPs, bytes and
    measured time per step, over `steps` calls after `warmup` uncounted ones, on `threads` of torch's threads
    (None: the cores other processes leave free, as a run picks them)."""
    sync = torch.cuda.synchronize if device.startswith("cuda") else None
    with contextlib.ExitStack() as stack:
        pin_threads(stack, threads)
        for _ in range(warmup):
            step()
        counter, meter = OpCounter(synchronize=sync), LoadMeter(device.split(":")[0])
        with counter:
            for _ in range(steps):
                step()
        return StepOps(counter.costs(steps), torch.get_num_threads(), meter.read())


def predicted_on(roof: Roof, ops: list[OpCost], bytes_scale: float = 1.0) -> list[OpCost]:
    """The same operators on another machine, as the roofline sees them: their FLOPs, bytes times `bytes_scale`
    (0.5: the fp32 step's tensors in bf16), and the roofline's time (no overhead, no cache: a best case)."""
    out = []
    for op in ops:
        nbytes = op.nbytes * bytes_scale
        out.append(replace(op, nbytes=nbytes, time_s=roof.time_s(op.flops, nbytes)))
    return out


def time_shares(ops: list[OpCost], roof: Roof, overhead_s: float = 0.0) -> dict[str, float]:
    """The share of the step's operator time by what bounds each operator (`OpCost.bound`)."""
    total = sum(op.time_s for op in ops) or 1.0
    shares: dict[str, float] = {}
    for op in ops:
        kind = op.bound(roof, overhead_s)
        shares[kind] = shares.get(kind, 0.0) + op.time_s / total
    return shares


def totals(ops: list[OpCost]) -> OpCost:
    """The whole step as one point: its FLOPs over its bytes, its operators' time."""
    return OpCost("step", "", "", sum(o.calls for o in ops), sum(o.flops for o in ops), sum(o.nbytes for o in ops),
                  sum(o.time_s for o in ops))


# -- moving a point: the same operator two ways, timed side by side ------------------------------------------
@dataclass(frozen=True)
class SideBySide:
    """Operators timed in alternating rounds (AB, BA, ...): each one's point (FLOPs, bytes, median time per
    call) and every round's timings, for `interval`."""

    ops: dict[str, OpCost]
    rounds: dict[str, list[list[float]]]
    load: MachineLoad

    def interval(self, candidate: str, base: str):
        """The speed-up of `candidate` over `base` (measure.stats.speedup_interval over the paired rounds)."""
        from .stats import speedup_interval

        return speedup_interval(self.rounds[base], self.rounds[candidate], busy=self.load.busy)

    def sentence(self, candidate: str, base: str) -> str:
        from .stats import sentence

        return sentence(candidate, self.interval(candidate, base), base)


def _timings(fn: Callable[[], object], timings: int, window_s: float) -> list[float]:
    t0 = time.perf_counter()
    fn()
    calls = max(1, int(window_s / max(time.perf_counter() - t0, 1e-9)))
    out = []
    for _ in range(timings):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        out.append((time.perf_counter() - t0) / calls)
    return out


def side_by_side(candidates: dict[str, Callable[[], object]], counts: dict[str, tuple[float, float]],
                 rounds: int = 5, timings: int = 5, window_s: float = 0.01, threads: int | None = None) -> SideBySide:
    """Time each of `candidates` (label → a call of the operator) in `rounds` alternating rounds of `timings`
    timings, each of as many calls as fill `window_s`; `counts` gives each one's (FLOPs, bytes) per call."""
    import statistics

    labels = list(candidates)
    runs: dict[str, list[list[float]]] = {label: [] for label in labels}
    with contextlib.ExitStack() as stack:
        pin_threads(stack, threads)
        for fn in candidates.values():
            fn()  # warm-up (a compiled function compiles here)
        meter = LoadMeter()
        for r in range(rounds):
            for label in labels if r % 2 == 0 else labels[::-1]:
                runs[label].append(_timings(candidates[label], timings, window_s))
        load = meter.read()
    ops = {label: OpCost(label, "", "", 1, counts[label][0], counts[label][1],
                         statistics.median(t for run in runs[label] for t in run)) for label in labels}
    return SideBySide(ops, runs, load)


def counted_call(fn: Callable[[], object]) -> tuple[float, float]:
    """(FLOPs, bytes) of one call of `fn`, every operator it runs counted by OpCounter."""
    counter = OpCounter()
    with counter:
        fn()
    ops = counter.costs()
    return sum(o.flops for o in ops), sum(o.nbytes for o in ops)


def ops_frame(ops: list[OpCost], roof: Roof, overhead_s: float = 0.0, top: int | None = 8):
    """A table of the longest operators (all with `top=None`): calls, MFLOP, KB moved, intensity, µs per step,
    the GFLOP/s each reached, and what bounds it on `roof`."""
    import pandas as pd

    rows = [{"operator": o.label, "calls": round(o.calls, 1), "MFLOP": round(o.flops / 1e6, 3),
             "KB moved": round(o.nbytes / 1e3, 1), "FLOP/byte": round(o.intensity, 2) if o.nbytes else None,
             "µs per step": round(o.time_s * 1e6, 1), "GFLOP/s": round(o.flops_per_s / 1e9, 3),
             "bound": o.bound(roof, overhead_s)} for o in ops[:top]]
    return pd.DataFrame(rows).set_index("operator")
