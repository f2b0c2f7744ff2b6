"""`scalekit.predict(model, gpus="8xH100-SXM", toggles=..., batch_size=..., seq_len=...)`: memory, step time,
tokens/s and MFU per GPU for GPUs that need not be here, with the assumptions each figure rests on.

Memory: for the built-in GPT, scalekit.estimate's own plan (its analytic per-layer inventory, per rank); for the
public shapes, mixed-precision AdamW's 16 bytes per parameter split as the sharding splits it, and the activations
walked op by op (saved_activations.py: the counted model's step on fake tensors, its checkpointing applied as torch
applies it; the peak is the most bytes alive at once).  Time: cost.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import ConfigError
from . import cost, host_work
from .collectives import Collective
from .inputs import as_number, check_sizes, first_given, toggles_of, whole_degree
from .memory import GIB, memory_per_gpu
from .parts import GPUS_PER_NODE
from .parts import gpus as parse_gpus
from .shapes import ModelShape, shape_of

# scalekit's selective checkpointing keeps every matmul's output; torchtitan's "op" policy recomputes every second one
SELECTIVE = ("selective", "selective-torchtitan")


@dataclass
class Prediction:
    """Per GPU figures of one training step of `model` on `cluster` under `layout`."""

    model: str
    gpus: str
    layout: cost.Layout
    batch_size: int
    seq_len: int
    memory: dict[str, int]  # params, grads, optimizer_state, activations, comm_buffers, peak (bytes)
    memory_method: str
    capacity_bytes: float
    fits: bool
    compute_s: float
    compute_parts: dict[str, float]  # matmul, memory traffic, per-op overhead (seconds)
    collectives: list[Collective]
    bubble_s: float
    step_s: float
    tokens_per_s_per_gpu: float
    mfu: float | None
    model_flops_per_gpu: float
    assumptions: list[str] = field(default_factory=list)

    @property
    def exposed_comm_s(self) -> float:
        return sum(c.exposed_s for c in self.collectives)

    def verdict(self) -> str:
        if self.fits:
            return (f"fits: {self.memory['peak'] / GIB:.1f} GiB of {self.capacity_bytes / GIB:.0f} GiB per GPU")
        return (f"does not fit: the plan needs {self.memory['peak'] / GIB:.1f} GiB per GPU and a "
                f"{self.gpus.split('× ')[-1].split(' (')[0]} has {self.capacity_bytes / GIB:.1f} GiB")

    def table(self) -> str:
        """The figures as plain text lines."""
        m = {k: v / GIB for k, v in self.memory.items()}
        lines = [f"{self.model} on {self.gpus}: batch {self.batch_size} × seq {self.seq_len}, {self.layout}",
                 "memory per GPU (GiB): " + ", ".join(f"{k} {v:.2f}" for k, v in m.items()) + f" — {self.verdict()}",
                 f"step {self.step_s * 1e3:.1f} ms = compute {self.compute_s * 1e3:.1f} ms ("
                 + ", ".join(f"{k} {v * 1e3:.1f}" for k, v in self.compute_parts.items())
                 + f") + exposed communication {self.exposed_comm_s * 1e3:.1f} ms + bubble {self.bubble_s * 1e3:.1f} ms"]
        for c in self.collectives:
            lines.append(f"  {c.name}: {c.calls} × {c.op} over {c.ranks} ranks, {c.bytes / 2**20:.2f} MiB, {c.algorithm} "
                         f"on {c.link}: {c.time_s * 1e3:.2f} ms, exposed {c.exposed_s * 1e3:.2f} ms ({c.overlap_rule})")
        mfu = f"{100 * self.mfu:.1f}%" if self.mfu is not None else "n/a"
        lines.append(f"tokens/s per GPU {self.tokens_per_s_per_gpu:,.0f}; MFU {mfu}")
        lines += [f"- {a}" for a in self.assumptions]
        return "\n".join(lines)


def layout_of(toggles: dict, world: int, shape: ModelShape) -> cost.Layout:
    """The layout the toggles ask for on `world` GPUs, refused in a sentence with the numbers when the degrees do
    not divide the heads, the layers or the GPUs."""
    from ..toggles.pipeline_parallel import parse as parse_pp
    from ..toggles.tensor_parallel import parse as parse_tp

    tp = parse_tp(toggles["tensor_parallel"])[0] if "tensor_parallel" in toggles else 1
    pp, schedule, micro = 1, None, whole_degree(toggles, "grad_accum", 2, "micro-batches per step")
    if "pipeline_parallel" in toggles:
        value = toggles["pipeline_parallel"]
        schedule, micro, stages = parse_pp("1f1b" if value is True else value)
        pp = stages or world // tp
    if tp > 1 and (shape.n_head % tp or shape.n_kv_head % tp):
        raise ConfigError(f"tensor_parallel {tp} does not divide the model's {shape.n_head} attention heads "
                          f"({shape.n_kv_head} key/value heads): each rank takes whole heads")
    if pp > 1 and shape.n_layer % pp:
        raise ConfigError(f"pipeline_parallel {pp} stages do not divide the model's {shape.n_layer} layers")
    cp = whole_degree(toggles, "context_parallel", 2, "ranks each sequence is split over")
    if cp < 1:
        raise ConfigError(f"context_parallel must be a degree of 1 or more; got {cp}")
    if world % (tp * pp * cp):
        raise ConfigError(f"tensor_parallel {tp} × pipeline stages {pp}"
                          + (f" × context_parallel {cp}" if cp > 1 else "")
                          + f" = {tp * pp * cp} does not divide {world} GPUs")
    sharding = next((s for s in ("fsdp", "ddp") if s in toggles), "none")
    if "zero" in toggles:
        sharding = str(toggles["zero"]) if toggles["zero"] is not True else "zero1"
    dp = world // (tp * pp * cp)
    dtype = "bf16" if "bf16" in toggles else "fp16" if "fp16" in toggles else "tf32" if "tf32" in toggles \
        else "fp32"  # as a run: fp32 matmuls unless a toggle says
    ckpt = toggles.get("checkpointing")
    ckpt = 1 if ckpt is True else as_number(ckpt)
    return cost.Layout(world, dp, tp, pp, sharding, schedule, micro, dtype, ckpt, "sdpa" in toggles, cp)


def predict(model, gpus="8xH100-SXM", toggles=None, batch_size: int | None = None, seq_len: int | None = None,
            per_node: int | None = None, efficiency: cost.Efficiency | None = None, strict: bool = False) -> Prediction:
    """Predict one training step of `model` on `gpus` (see scalekit/predict/parts.py for the names): memory per
    GPU and whether it fits, the step time split into compute, exposed communication (per collective) and the
    pipeline bubble, tokens/s per GPU and MFU, and the assumptions they rest on.

    `model`: a public shape ('llama3-8b', 'gpt2-124m', ...), a built-in preset, a GPTConfig, a RunConfig of the
    built-in GPT, a transformers config, or a built model carrying one (a transformers model, scalekit's GPT).  `toggles` as RunConfig takes them (a list or a dict): fsdp, ddp,
    zero ('zero1'/'zero2'), tensor_parallel (degree), pipeline_parallel ('1f1b/8'), bf16, checkpointing, sdpa.
    `batch_size` is the global batch (rows), split over the data-parallel ranks.  `strict`: raise a ConfigError
    when the plan does not fit."""
    from .calibrate import this_cpu

    if isinstance(gpus, str) and gpus.strip().lower().split("x")[-1].strip() in ("this-cpu", "cpu"):
        this_cpu()  # measured on first use
    cluster = parse_gpus(gpus, per_node)
    toggles = toggles_of(toggles if toggles is not None else getattr(model, "toggles", None))
    shape = shape_of(model)
    part = cluster.part
    eff = efficiency or part.efficiency or cost.PUBLISHED
    preset = _preset_defaults(model, shape)
    check_sizes(seq_len, batch_size)  # as given: 0 is refused, not taken for 'not given'
    seq = first_given(seq_len, getattr(model, "seq_len", None), preset.block_size if preset else 1024)
    layout = layout_of(toggles, cluster.count, shape)
    batch = first_given(batch_size, getattr(model, "batch_size", None), preset.batch_size if preset else layout.dp)
    check_sizes(seq, batch)
    rows_per_micro = _rows(batch, layout)
    if layout.cp > 1 and seq % (2 * layout.cp):
        raise ConfigError(f"context_parallel {layout.cp} splits each sequence into 2 × {layout.cp} chunks (two per "
                          f"rank, one from each end, so that causal attention's work is balanced): seq_len {seq} "
                          f"does not divide into {2 * layout.cp}")
    assumptions: list[str] = []
    memory, method = memory_per_gpu(model, shape, layout, toggles, batch, seq, rows_per_micro, part, assumptions)
    model_flops = shape.train_flops_per_token(seq) * batch * seq / cluster.count  # this GPU's share of the work
    compute_s, parts, colls, bubble_s, counted = _step_time(model, toggles, shape, layout, cluster, eff,
                                                            rows_per_micro, seq)
    step_s = compute_s + sum(c.exposed_s for c in colls) + bubble_s
    peak = part.peak(layout.dtype)
    tokens_per_gpu = batch * seq / layout.world / step_s if step_s else 0.0
    # the step's tokens over every GPU (as torchtitan counts tokens/s per GPU)
    fits = memory["peak"] <= part.memory_bytes
    pred = Prediction(shape.name if not isinstance(model, str) else model, cluster.describe(), layout, batch, seq,
                      memory, method, part.memory_bytes, fits, compute_s,
                      parts, colls, bubble_s,
                      step_s, tokens_per_gpu, model_flops / step_s / peak if step_s else None, model_flops,
                      assumptions)
    assumptions += _assumptions(pred, eff, part, shape, counted, toggles)
    if strict and not fits:
        raise ConfigError(pred.verdict())
    return pred


def _step_time(model, toggles, shape, layout, cluster, eff, rows_per_micro, seq):
    """(compute seconds, its parts, the collectives timed, the bubble's seconds, what was counted) of one step on
    one GPU."""
    part = cluster.part
    counted = _counted(shape, layout, eff, part, rows_per_micro, seq, toggles)
    matmul_s, memory_s, attention_s = counted["matmul"], counted["memory traffic"], counted["attention"]
    # the step's operators once per micro-batch; a pipeline rank runs only its stage's share of them
    ops = _ops(model, toggles, shape) * layout.micro_batches / layout.pp if eff.op_overhead_s else 0
    ops_s = ops * eff.op_overhead_s
    if eff.queued_dispatch:  # a GPU's host runs ahead of its kernels: only the dispatch they do not cover shows
        ops_s = max(0.0, ops_s - matmul_s - memory_s)
    colls = cost.step_collectives(shape, layout, rows_per_micro, seq)
    host_s, counted["host work"] = host_work.host_seconds(shape, layout, eff, colls, rows_per_micro, seq)
    compute_s = matmul_s + memory_s + ops_s + host_s  # cost.py: matmuls compute-bound, the rest memory-bound, added
    cost.time_collectives(colls, cluster, eff, compute_s, layout, attention_s)
    bubble = cost.bubble_fraction(layout.pp, layout.micro_batches, layout.schedule)
    bubble_s = compute_s * bubble / (1 - bubble) if bubble else 0.0
    parts = {"matmul": matmul_s, "memory traffic": memory_s, "per-op overhead": ops_s}
    if host_s:
        parts["host work (DTensor, FSDP2 hooks)"] = host_s
    return compute_s, parts, colls, bubble_s, counted


def autocast_device(part) -> str:
    """Whose autocast policy a part's count follows: the CPU's for this machine's calibrated part ("this-cpu"), the
    CUDA one for every GPU of the parts table."""
    return "cpu" if part.name.startswith("this-cpu") else "cuda"


def _counted(shape, lay: cost.Layout, eff, part, rows: int, seq: int, toggles) -> dict:
    """Seconds of matmul (fused attention included, and apart) and of memory traffic, and the bytes moved, of one
    step on one GPU, from the operators counted in the model's own code (traffic.py).  Backward as traffic.py
    derives it; checkpointing's recompute added: a whole block's forward (every k-th block), or the operators that
    are not matmuls (scalekit's 'selective'; torchtitan's op policy also recomputes every second matmul)."""
    from . import traffic

    autocast = lay.dtype in ("bf16", "fp16")
    bf16_weights = autocast and lay.sharding == "fsdp"  # FSDP's param_dtype: the gathered weights are bf16
    counted = traffic.model_traffic(shape, seq, lay.flash_attention, autocast, 2 if bf16_weights else 4,
                                    autocast_device(part))
    layers = shape.n_layer // lay.pp
    # rows this GPU runs, a tensor-parallel rank's share of each and a context-parallel rank's share of every sequence
    # (its attention too: the sequence split into 2·cp chunks, two per rank, balances the causal work)
    share = rows * lay.micro_batches / (lay.tp * lay.cp)
    fwd, block, peak, ckpt = counted.forward(layers), counted.block, part.peak(lay.dtype), lay.checkpointing
    recomputed_blocks = 0 if ckpt is None or isinstance(ckpt, str) else layers // ckpt

    def at(size: int) -> float:
        return eff.matmul_at(size, peak, lay.dtype)

    # the matmuls at one micro-batch's rows (their size sets a CPU's rate), then times the micro-batches; each on its
    # own roofline (traffic.matmul_seconds: the longer of its FLOPs' time and its bytes' at the memory's rate)
    bandwidth = part.memory_bandwidth * eff.memory
    mm_s = traffic.matmul_seconds(traffic.scaled(fwd.matmuls, rows), at, bandwidth)
    # the root's matmuls (the head): each tensor-parallel rank runs them whole (scalekit's plan splits the blocks)
    root_mm_s = traffic.matmul_seconds(traffic.scaled(counted.root.matmuls, rows), at, bandwidth)
    block_mm_s = traffic.matmul_seconds(traffic.scaled(block.matmuls, rows), at, bandwidth)
    mm_total = 3 * mm_s + recomputed_blocks * block_mm_s + (layers * block_mm_s / 2 if ckpt == "selective-torchtitan"
                                                            else 0.0)
    attention_rate = peak * eff.attention if eff.attention else eff.matmul_at(shape.d // shape.n_head, peak, lay.dtype)
    attention_s = ((1 + traffic.ATTENTION_BACKWARD_FLOPS) * fwd.attention_flops
                   + recomputed_blocks * block.attention_flops) / attention_rate * share
    moved = _element_bytes(counted, shape, lay, toggles, rows, seq, recomputed_blocks, bf16_weights,
                           inline_host=eff.fsdp_call_s > 0)
    per_rank = lay.micro_batches / (lay.tp * lay.cp)
    matmul_s = (mm_total - 3 * root_mm_s) * per_rank + 3 * root_mm_s * per_rank * lay.tp
    return {"matmul": matmul_s + attention_s, "attention": attention_s,
            "memory traffic": sum(moved.values()) / (part.memory_bandwidth * eff.memory), "bytes": moved,
            "code": counted.code}


def _element_bytes(counted, shape, lay: cost.Layout, toggles, rows, seq, recomputed_blocks, bf16_weights,
                   inline_host: bool = False):
    """Bytes one GPU's operators that are not matmuls move in a step, by what moves them.  Eager: each counted
    operator's reads and writes, backward 2× (traffic.py).  Under compile the blocks' element-wise traffic is the
    fused floor, each saved activation's passes, and the root's (embeddings, head, loss) stays eager: torchtitan
    compiles each block, not the loss."""
    from . import traffic

    layers = shape.n_layer // lay.pp
    fwd, block, passes = counted.forward(layers), counted.block, 1 + traffic.BACKWARD_BYTES
    params = shape.n_params / (lay.tp * lay.pp)
    held = params / lay.grad_ranks if lay.sharding in ("fsdp", "zero1", "zero2") else params
    out = {"optimizer (AdamW: 28 B per held parameter)": 28 * held}
    # a tensor-parallel rank moves the split modules' bytes for 1/tp of the work, the rest (norms, residual adds,
    # embeddings, head, loss) for all of it (traffic.Traffic.per_rank_bytes)
    tokens, tp = rows * lay.micro_batches / lay.cp, lay.tp
    if "compile" in toggles:
        saved = _saved_per_row(shape, lay, seq) * rows * lay.micro_batches
        out["blocks, compiled (saved activations × 5 passes)"] = ACTIVATION_PASSES * saved
        out["root, eager (embeddings, head, loss)"] = passes * counted.root.per_rank_bytes(tp) * tokens
    else:
        out["operators, eager (counted, backward 2×)"] = passes * fwd.per_rank_bytes(tp) * tokens
    if isinstance(lay.checkpointing, str) and "compile" not in toggles:
        out["selective recompute (the cheap operators again)"] = \
            layers * block.per_rank_bytes(tp, attention=False) * tokens
    if recomputed_blocks:
        out["full recompute (the blocks' forward again)"] = recomputed_blocks * block.per_rank_bytes(tp) * tokens
    if lay.sharding in ("fsdp", "zero2") and lay.grad_ranks > 1 and not inline_host:
        # (where the host runs them inline, host_work.py's calibrated calls hold these copies)
        # FSDP2 copies each gathered unit out of the all-gather's buffer into the parameters (read and write, once
        # per gather), and each gradient into the reduce-scatter's input (cast to fp32, then copied)
        gathers = lay.micro_batches * (2 if lay.sharding == "fsdp" else 1)
        param_bytes = 2 if bf16_weights else 4
        out["FSDP copy-out and copy-in"] = params * (gathers * 2 * param_bytes + (param_bytes + 4) + 2 * 4)
    if lay.cp > 1:
        # ring attention merges each arriving block's partial output into the running one (rescale and add in fp32:
        # read two, write one) cp−1 times per layer forward, and adds each block's query gradient as many times back
        merged = rows * lay.micro_batches * (seq // lay.cp) * shape.d / lay.tp * 4
        out["ring attention's merges (context parallel)"] = 2 * 3 * (lay.cp - 1) * layers * merged
    return out


def _saved_per_row(shape, lay: cost.Layout, seq: int) -> float:
    """Korthikanti's saved activations of one row on this GPU (as _formula_memory counts them, without the head)."""
    s, h, a = seq, shape.d, shape.n_head
    per_layer = s * h * 34 + (0 if (lay.flash_attention or lay.checkpointing in SELECTIVE)
                              else 5 * a * s * s)
    return per_layer / lay.tp * (shape.n_layer // lay.pp)


def _preset_defaults(model, shape):
    """The built-in preset a name (or a RunConfig's preset) stands for (its default batch and context), else None."""
    from ..models.presets import PRESETS

    name = model if isinstance(model, str) else getattr(model, "preset", None)
    return PRESETS.get(name) if isinstance(name, str) and shape.source.startswith("scalekit") else None


def _rows(batch: int, lay: cost.Layout) -> int:
    per_rank = lay.dp * lay.micro_batches
    if batch % per_rank:
        raise ConfigError(f"batch_size {batch} does not split into {lay.dp} data-parallel ranks × "
                          f"{lay.micro_batches} micro-batches ({per_rank} rows at a time)")
    return batch // per_rank


ACTIVATION_PASSES = 5  # a saved activation: written and read in forward, read in backward, its gradient written and read


def _ops(model, toggles, shape) -> int:
    """Operators dispatched in one training step of the built-in GPT, counted by running one step of the preset at
    batch 1 on this CPU (the count does not depend on the batch); 0 where the model is not the built-in GPT.  A toggle
    this CPU cannot take (tf32: how a GPU's matmuls compute, not how many operators run) is counted without, and so is
    compile: the counting dispatch mode sees the compiled step's operators as the eager ones (tiny with bf16: 658
    both ways; with sdpa too: 582 both ways), and compiling the preset on a 2-core CPU to count them took 19 s (tiny)
    to 27 s (gpt2-124m) a rung, cold."""
    from ..machine.hardware import detect
    from ..toggles import TOGGLES
    from .ops import count_step_ops

    preset = model if isinstance(model, str) else getattr(model, "preset", None)
    if not shape.source.startswith("scalekit") or preset is None:
        return 0
    cpu = detect("cpu")
    # per micro-batch: the caller multiplies by the micro-batches (gradient accumulation's steps included)
    local = {k: v for k, v in toggles.items() if k not in ("ddp", "fsdp", "zero", "tensor_parallel",
                                                           "pipeline_parallel", "grad_accum", "context_parallel",
                                                           "compile")
             and (k not in TOGGLES or TOGGLES[k].available(cpu)[0])}
    return count_step_ops(preset, tuple(sorted((k, str(v)) for k, v in local.items())))


# the toggles the cost model has a term for; any other is predicted as if it were off (and said so)
MODELLED = ("fsdp", "ddp", "zero", "tensor_parallel", "pipeline_parallel", "bf16", "fp16", "tf32", "checkpointing",
            "sdpa", "grad_accum", "compile", "context_parallel")


def unmodelled(toggles) -> list[str]:
    """The toggles among `toggles` the cost model has no term for."""
    return [t for t in toggles_of(toggles) if t not in MODELLED]


def _assumptions(pred: Prediction, eff: cost.Efficiency, part, shape, counted: dict, toggles) -> list[str]:
    lay = pred.layout
    out = [f"GPUs: {pred.gpus}; a group of ranks within one node talks over {part.intra_link}, across nodes over "
           f"{part.inter_link} (nodes of {GPUS_PER_NODE} unless per_node= says otherwise)",
           f"peak: {part.name} dense {lay.dtype} {part.peak(lay.dtype) / 1e12:,.1f} TFLOP/s "
           f"({part.sources.get('flops', 'measured by calibrate()')})",
           f"compute: a roofline per matmul and per class of the other operators, matmul time + other operators' memory traffic time + per-op "
           f"overhead, from the operators of one forward counted on fake tensors in {counted['code']} "
           f"(backward: matmuls 2×, fused attention 2.5×, other operators' bytes 2×); "
           + (f"bf16 autocast counted with {'CPU' if autocast_device(part) == 'cpu' else 'CUDA'} autocast's op lists "
              f"(aten/src/ATen/autocast_mode.h: on a GPU softmax, log_softmax, layer_norm and the losses in fp32); "
              if lay.dtype in ("bf16", "fp16") else "")
           + f"each matmul on its own roofline, the "
           f"longer of its FLOPs at the matmul rate and its bytes (inputs and output at their dtypes) at the memory "
           f"traffic's rate below; matmul "
           f"efficiency {_curve_words(eff, lay.dtype) if eff.matmul_curve else eff.matmul}"
           f" ({eff.sources.get('matmul', '')})"
           + (f"; fused attention at {eff.attention:.2f} of the peak ({eff.sources.get('attention', '')})"
              if eff.attention and lay.flash_attention else ""),
           f"memory traffic: {sum(counted['bytes'].values()) / 1e9:.2f} GB per step per GPU ("
           + ", ".join(f"{k} {v / 1e9:.2f}" for k, v in counted["bytes"].items())
           + f") at {eff.memory:.2f} of {part.memory_bandwidth / 1e9:,.0f} GB/s ({eff.sources.get('memory', '')})",
           cost.collectives_assumption(eff),
           "model FLOPs (MFU): 6N + 12·L·d·T per token (PaLM appendix B); the hardware's include what checkpointing "
           "recomputes and a fused attention's causal half"]
    out += [f"algorithm of the {c.name}: {c.algorithm_note}" for c in pred.collectives if c.algorithm_note]
    out += [f"overlap {name}: {text}" for name, text in cost.OVERLAP_RULES.items()
            if any(c.overlap_rule == name for c in pred.collectives)]
    if lay.pp > 1:
        out.append(f"bubble: (p−1)/(m+p−1) = {cost.bubble_fraction(lay.pp, lay.micro_batches, lay.schedule):.3f} of "
                   f"the step for {lay.schedule} with {lay.pp} stages and {lay.micro_batches} micro-batches")
    out.append("per GPU, tokens count once per tensor-parallel group and pipeline; data loading is taken as hidden")
    if lay.grad_ranks > 1 and lay.sharding == "none":
        out.append(f"no data-parallel toggle: the {lay.grad_ranks} data-parallel groups split the batch but nothing "
                   f"synchronises their gradients (a scalekit run refuses these toggles on these ranks): add fsdp (or ddp)")
    if unmodelled(toggles):
        out.append(f"not modelled: {', '.join(unmodelled(toggles))} (the step time is predicted as without them; "
                   f"the memory figure still comes from the planner where it is scalekit.estimate's)")
    host = {k: n for k, n in counted.get("host work", {}).items() if n and getattr(eff, k)}
    if host:
        out.append("host work of the DTensor wrappers, run inline by this host: " + ", ".join(
            f"{n:,} {host_work.COUNTED[k]}" for k, n in host.items()) + " ("
            + "; ".join(eff.sources.get(k, k) for k in host) + ")")
    out.append(f"per-op overhead: {eff.op_overhead_s * 1e6:.1f} µs per operator ({eff.sources.get('op_overhead_s', '')})"
               + ("; the host queues kernels ahead of the device: only the dispatch that exceeds the kernels' time is "
                  "added" if eff.queued_dispatch else ""))
    return out


def _curve_words(eff: cost.Efficiency, dtype: str) -> str:
    """Which calibrated curve a prediction read its matmul rates from."""
    which = f"{dtype} " if dtype in eff.matmul_curves else ""
    return f"read from the calibrated {which}curve at each matmul's size"


def predict_decode(model, gpus="A100-80GB-SXM", weight_bytes: float = 2.0, batch: int = 1, context: int = 0,
                   efficiency: cost.Efficiency | None = None) -> dict:
    """Decode (one new token per sequence per forward) is bound by memory bandwidth: every step reads the weights
    (`weight_bytes` per parameter: 2 for bf16, 1 for int8) and the KV cache.  Returns the predicted tokens/s (at
    the memory efficiency), the bandwidth ceiling (at 100%) and the compute bound."""
    shape = shape_of(model)
    part = parse_gpus(gpus).part
    eff = efficiency or part.efficiency or cost.PUBLISHED
    kv = 2 * shape.n_layer * context * shape.n_kv_head * (shape.d // shape.n_head) * 2 * batch
    read = shape.n_params * weight_bytes + kv
    ceiling = part.memory_bandwidth / read * batch
    compute = part.peak("bf16") * eff.matmul / (2 * shape.n_params)
    return {"tokens_per_s": min(ceiling * eff.memory, compute * batch), "ceiling_tokens_per_s": ceiling,
            "bytes_per_step": read, "assumption": f"bandwidth-bound: {read / 1e9:.2f} GB read per step at "
            f"{eff.memory:.2f} of {part.memory_bandwidth / 1e9:,.0f} GB/s"}


__all__ = ["predict", "predict_decode", "Prediction", "layout_of"]
