"""The host work of the parallel wrappers built on DTensor, where the host runs it inline (a CPU): what FSDP2 and
tensor parallelism add to a step's CPU time beyond the operators and collectives the rest of the model prices.

- FSDP2's hooks around each collective call: copy-in (the unit's shards packed into one buffer), copy-out (the
  gathered buffer split back into parameters), and its bookkeeping (`fsdp_call_s`, per all-gather or
  reduce-scatter call, and `fsdp_host_bandwidth`, bytes per second of the bytes it gathers or reduces: a fresh
  buffer each, filled and emptied);
- the optimizer's step on parameters that are DTensors (FSDP2's shards, tensor parallelism's split weights): each
  of AdamW's per-parameter operators goes through DTensor's dispatch, several times a plain tensor's
  (`dtensor_param_s`, per parameter tensor per step);
- a tensor-parallel linear's forward and backward: its input and output converted to and from DTensors, the
  matmul dispatched on them, its output all-reduced into a new tensor (`tp_linear_s`, per linear per forward and
  backward, and `tp_host_bandwidth`, bytes per second of its full-width activation).

Each per-call and per-byte pair is solved from two sizes of the same model.  `calibrate()` measures the five in the
gloo ranks it starts for the collectives (`measure`), on small models
whose arithmetic is negligible, as CPU time of each rank's own thread (time.thread_time: what the rank computes,
not how long it waits for the other), against the same model unwrapped.  On a GPU the host queues kernels ahead of
the device and this work is taken as hidden behind them, as the per-operator overhead is: the parts of the table
carry 0.
"""

from __future__ import annotations

import copy
import math
import time

FIELDS = ("fsdp_call_s", "fsdp_host_bandwidth", "dtensor_param_s", "tp_linear_s", "tp_host_bandwidth")
WIDTH = 16  # the microbenchmark models' width: their matmuls cost microseconds, the wrappers' work dominates
UNITS = 4  # FSDP units (_unit) beside the root's own linear; tensor-parallel column/row pairs
ITERATIONS = 3  # steps per timing: the same on every rank (their collectives must match)
MIN_REPEATS = 4  # timings per figure at least: each is milliseconds, and the fastest of more is less disturbed
TRIES = 3  # a per-byte cost that came out at or below 0 (noise larger than the signal) is measured again


def measure(repeats: int = 3) -> dict[str, float]:
    """The five figures (FIELDS: seconds, and bytes per second), in a rank of an initialised gloo process group
    (every rank calls it); a per-byte cost still at or below 0 after TRIES is taken as none (math.inf bytes/s) and
    sources() says it was not resolved."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        torch.manual_seed(0)
        repeats = max(repeats, MIN_REPEATS)
        fsdp_call, fsdp_bandwidth, dtensor_param = _fsdp(mesh, repeats)
        tp_linear, tp_bandwidth = _tp(mesh, repeats)
        return {"fsdp_call_s": fsdp_call, "fsdp_host_bandwidth": fsdp_bandwidth, "dtensor_param_s": dtensor_param,
                "tp_linear_s": tp_linear, "tp_host_bandwidth": tp_bandwidth}
    finally:
        torch.set_num_threads(threads)


def _time(fn, repeats: int) -> float:
    """The fastest of `repeats` timings of ITERATIONS calls, per call, in this thread's CPU seconds (a rank another
    process preempts loses wall time, not CPU time; the fastest is the least disturbed)."""
    fn()  # warm-up: DTensor's sharding propagation caches, FSDP2's lazy initialisation
    times = []
    for _ in range(repeats):
        t0 = time.thread_time()
        for _ in range(ITERATIONS):
            fn()
        times.append((time.thread_time() - t0) / ITERATIONS)
    return min(times)


def _stack(*widths):
    import torch

    return torch.nn.Sequential(*[torch.nn.Linear(a, b) for a, b in zip(widths, widths[1:], strict=False)])


def _unit(width: int):
    """An FSDP unit with a block's mix of parameters: two linears around a layer norm (6 tensors)."""
    import torch

    return torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.LayerNorm(width), torch.nn.Linear(width, width))


def _fsdp_pass(mesh, width: int, repeats: int) -> tuple[float, int, int, float, float]:
    """(extra host seconds of one forward and backward under FSDP2, its gather and reduce-scatter calls, their
    bytes, AdamW's step on the sharded parameters and on the plain ones, in seconds): UNITS units, each its own
    FSDP unit, and a linear on the root, against the same model unwrapped."""
    import torch
    from torch.distributed.fsdp import fully_shard

    from ..distributed.collective_bench import recording

    plain = torch.nn.Sequential(*[_unit(width) for _ in range(UNITS)], torch.nn.Linear(width, width))
    sharded = copy.deepcopy(plain)
    for unit in list(sharded)[:UNITS]:
        fully_shard(unit, mesh=mesh)
    fully_shard(sharded, mesh=mesh)  # the last linear stays the root's own parameters
    x = torch.randn(8, width)
    times = {}
    for name, model in (("plain", plain), ("sharded", sharded)):
        times[name] = _time(lambda model=model: model(x).sum().backward(), repeats)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        times[name + " step"] = _time(opt.step, repeats)
    with recording() as calls:  # FSDP2's gathers and reduce-scatters in one forward and backward, and their bytes
        sharded(x).sum().backward()
    made = [nbytes for op, nbytes in calls if op in ("all_gather", "reduce_scatter")]
    return (times["sharded"] - times["plain"], len(made), sum(made),
            times["sharded step"] - times["plain step"], len(list(plain.parameters())))


def _fsdp(mesh, repeats: int) -> tuple[float, float, float]:
    """(host seconds per FSDP2 collective call, host bytes/s of the bytes it gathers or reduces, host seconds per
    DTensor parameter in AdamW's step): the extra time at two widths (16: the calls' fixed work; 256: 1.6 MB a
    unit, their work per byte: copy-in, copy-out, a fresh buffer each) solved for the two terms."""
    for _ in range(TRIES):
        (t0, calls, b0, step_s, tensors), (t1, _, b1, _, _) = (_fsdp_pass(mesh, WIDTH, repeats),
                                                              _fsdp_pass(mesh, 16 * WIDTH, repeats))
        per_byte = (t1 - t0) / (b1 - b0)  # the same calls at both widths, more bytes in each
        if _every_rank(per_byte > 0):
            break
    per_byte = max(0.0, per_byte)
    per_call = max(0.0, (t0 - per_byte * b0) / calls)
    # the step's extra at the small width, where AdamW's arithmetic is negligible beside its dispatch
    return per_call, (1 / per_byte if per_byte else math.inf), max(0.0, step_s) / tensors


def _every_rank(flag: bool) -> bool:
    """Whether `flag` holds on every rank (a measurement is redone on all of them or on none: their calls match)."""
    import torch
    import torch.distributed as dist

    held = torch.tensor([1 if flag else 0])
    dist.all_reduce(held, op=dist.ReduceOp.MIN)
    return bool(held.item())


def _tp_pass(mesh, rows: int, repeats: int) -> float:
    """Extra host seconds per tensor-parallel linear per forward and backward at `rows` rows: UNITS column/row pairs
    split by torch's ColwiseParallel and RowwiseParallel, against the unsplit linears one rank computes (the same
    arithmetic: what is left is the wrappers' work)."""
    import torch
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    n = mesh.size()
    width = WIDTH * n
    split = _stack(*[width, 2 * width] * UNITS, width)
    parallelize_module(split, mesh, {str(i): ColwiseParallel() if i % 2 == 0 else RowwiseParallel()
                                     for i in range(2 * UNITS)})
    local = _stack(*[width, 2 * width // n] * UNITS, width)
    x = torch.randn(rows, width)
    times = {}
    for name, model in (("local", local), ("split", split)):
        times[name] = _time(lambda model=model: model(x).sum().backward(), repeats)
    return (times["split"] - times["local"]) / (2 * UNITS)


def _tp(mesh, repeats: int) -> tuple[float, float]:
    """(host seconds per tensor-parallel linear per forward and backward, host bytes/s of its full-width activation):
    the extra at 8 and 4,096 rows solved for the two terms (the all-reduce's copy of its output, DTensor's wrapping
    and unwrapping grow with the rows)."""
    width = WIDTH * mesh.size()
    few, many = 8, 4096
    for _ in range(TRIES):
        t0, t1 = _tp_pass(mesh, few, repeats), _tp_pass(mesh, many, repeats)
        per_byte = (t1 - t0) / ((many - few) * width * 4)
        if _every_rank(per_byte > 0):
            break
    per_byte = max(0.0, per_byte)
    return max(0.0, t0 - per_byte * few * width * 4), (1 / per_byte if per_byte else math.inf)


def sources(figures: dict[str, float], ranks: int) -> dict[str, str]:
    """Where each figure came from, in words (none where calibrate() measured none: the part then has no such term)."""
    if not figures:
        return {}
    where = f"calibrate(): over {ranks} gloo ranks, CPU time of each rank's thread against the model unwrapped"

    def rate(field: str) -> str:
        if math.isinf(figures[field]):
            return f"not resolved from the noise here in {TRIES} tries, taken as none"
        return f"at {figures[field] / 1e9:.2f} GB/s"

    return {"fsdp_call_s": f"{where}, FSDP2 units of 6 parameters at widths {WIDTH} and {16 * WIDTH}: "
                           f"{figures['fsdp_call_s'] * 1e6:.0f} µs per all-gather or reduce-scatter call, plus "
                           f"its bytes {rate('fsdp_host_bandwidth')} (copy-in, copy-out, a fresh buffer each)",
            "dtensor_param_s": f"{where}, AdamW's step on FSDP2's sharded parameters (DTensors) at width {WIDTH}: "
                               f"{figures['dtensor_param_s'] * 1e6:.0f} µs more per parameter",
            "tp_linear_s": f"{where}, ColwiseParallel/RowwiseParallel linears at width {WIDTH * ranks} and 8 and 4,096 "
                           f"rows, against the unsplit linears a rank computes: {figures['tp_linear_s'] * 1e6:.0f} µs "
                           f"more per linear, forward and backward, plus its full-width activation "
                           f"{rate('tp_host_bandwidth')}"}


def norm_tensors(shape) -> int:
    """A block's normalisation parameters: GPT-2's two LayerNorms' weights and biases, Llama's two RMSNorm weights."""
    return 4 if shape.mlp_matrices == 2 else 2


# what each calibrated cost is paid per, in a prediction's words
COUNTED = {"fsdp_call_s": "FSDP2 collective calls", "dtensor_param_s": "DTensor parameters in the optimizer's step",
           "tp_linear_s": "tensor-parallel linears (forward and backward)"}


def host_seconds(shape, lay, eff, colls, rows: int, seq: int) -> tuple[float, dict[str, int]]:
    """(seconds, {cost field: count}) of the wrappers' host work in one step of one rank: FSDP2's collective calls,
    the optimizer's DTensor parameters, tensor parallelism's linears (per micro-batch of `rows` × `seq` tokens),
    each at its calibrated cost and the bytes at its calibrated rate; 0 where the part carries none (a GPU's host
    work is taken as hidden)."""
    blocks = shape.n_layer // lay.pp
    counts = dict.fromkeys(COUNTED, 0)
    gathered = [c for c in colls if c.op in ("all_gather", "reduce_scatter")]
    fsdp_bytes = tp_bytes = 0
    if lay.grad_ranks > 1 and lay.sharding in ("fsdp", "zero2"):
        counts["fsdp_call_s"] = sum(c.calls for c in gathered)
        fsdp_bytes = sum(c.bytes for c in gathered)
        counts["dtensor_param_s"] = (len(shape.root) + shape.n_layer * len(shape.block)) // lay.pp
    elif lay.tp > 1:  # the split linears' weights and biases (norms and the root stay plain tensors)
        counts["dtensor_param_s"] = blocks * (len(shape.block) - norm_tensors(shape))
    if lay.tp > 1:
        counts["tp_linear_s"] = blocks * sum(1 for s in shape.block if len(s) == 2) * lay.micro_batches
        tp_bytes = counts["tp_linear_s"] * rows * seq * shape.d * lay.act_bytes  # each one's full-width activation
    seconds = sum(n * getattr(eff, field) for field, n in counts.items())
    return seconds + fsdp_bytes / eff.fsdp_host_bandwidth + tp_bytes / eff.tp_host_bandwidth, counts
