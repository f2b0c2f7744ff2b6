"""Quantization methods for the `quantize` toggle: one function per library, each swapping a model's linear
layers for quantized ones in place.

What is quantized: the linear layers of the model's repeated blocks (`models.blocks.find_blocks`: for the
built-in GPT, c_attn, c_proj, c_fc and the MLP's c_proj of every block): nn.Linear, its subclasses that compute
the same (Falcon's FalconLinear, made plain nn.Linear first), and transformers' Conv1D (made nn.Linear).  The
token embedding, which the built-in GPT ties to its output head, and the position table stay in full precision,
as transformers' bitsandbytes integration keeps `lm_head`: the embedding is read by row lookups, not matmuls,
and untying it to quantize the head would add a second copy of it.  Each library is imported only when its method is
chosen, so scalekit imports without any of them.
"""

from __future__ import annotations

import copy
import importlib.util
import warnings
from collections.abc import Callable

import torch
from torch._subclasses.fake_tensor import is_fake
from torch.nn.modules.linear import NonDynamicallyQuantizableLinear
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from ..errors import ConfigError, ToggleUnavailable, toggle_why
from ..optional import quiet_import, silence_known_warnings
from .blocks import block_linears, find_blocks, is_conv1d, own_model_on_meta

# method -> (library it needs, what it does, in a line)
METHODS: dict[str, tuple[str, str]] = {
    "torchao-int8": ("torchao", "torchao int8 weight-only: int8 weights with a scale per output channel; "
                                "activations stay in float"),
    "torchao-int8-dynamic": ("torchao", "torchao int8 dynamic: int8 weights, activations quantized per token "
                                        "at run time, int8 matmuls"),
    "torchao-int4": ("torchao", "torchao int4 weight-only (IntxWeightOnly): int4 values in groups of 32 with "
                                "a scale each; on CPU stored unpacked, one int8 byte per value"),
    "bnb-int8": ("bitsandbytes", "bitsandbytes LLM.int8() (Linear8bitLt): int8 weights and activations, "
                                 "outlier features (|x| > 6) kept in float"),
    "bnb-nf4": ("bitsandbytes", "bitsandbytes 4-bit NormalFloat (Linear4bit): blocks of 64, their absmax "
                                "quantized again (QLoRA's format)"),
    "bnb-fp4": ("bitsandbytes", "bitsandbytes 4-bit float (Linear4bit, fp4): blocks of 64, absmax quantized "
                                "again"),
    "hqq-8bit": ("hqq", "HQQ 8-bit: per group of 64, a min-max scale and a zero point fitted by "
                        "half-quadratic optimization (hqq's default solver moves only the zero), no calibration data"),
    "hqq-4bit": ("hqq", "HQQ 4-bit: per group of 64, a min-max scale and a fitted zero point, no calibration data"),
    "hqq-2bit": ("hqq", "HQQ 2-bit: per group of 64, a min-max scale and a fitted zero point, no calibration data"),
    "torch-dynamic-int8": ("torch", "torch.ao quantize_dynamic: int8 weights (one scale per tensor), "
                                    "activations quantized per batch, fbgemm int8 matmuls (CPU)"),
    "gptq": ("gptqmodel", "GPTQ: weights rounded column by column, the error compensated with second-order "
                          "information from calibration data"),
    "awq": ("gptqmodel", "AWQ: channels that see large activations scaled up before rounding, found with "
                         "calibration data"),
}
CALIBRATED = ("gptq", "awq")

# preference lists, for the ladder and autotune: torchao's weight-only int8 (the gpt-fast route), then bitsandbytes;
# HQQ's 4-bit (two values per byte on any device), then bitsandbytes nf4
INT8_METHODS = ("torchao-int8", "bnb-int8", "hqq-8bit", "torch-dynamic-int8")
INT4_METHODS = ("hqq-4bit", "bnb-nf4", "torchao-int4")

def method_available(method: str, device_type: str) -> tuple[bool, str]:
    """Whether `method` can run on a `device_type` machine here, and why not."""
    library = METHODS[method][0]
    if method in CALIBRATED:
        if device_type != "cuda":
            return False, (f"{method.upper()} runs on CUDA GPUs only: its maintained library (gptqmodel) needs "
                           f"torch >= 2.14.1 and GPU kernels, and AutoAWQ/auto-gptq no longer import with "
                           f"current transformers")
        return False, (f"{method.upper()} needs calibration data and gptqmodel, which quantizes Hugging Face "
                       f"checkpoints; scalekit does not wire it to the built-in GPT yet")
    if method == "torch-dynamic-int8":
        if device_type != "cpu":
            return False, "torch's dynamic int8 Linear runs on CPUs only (fbgemm/x86 kernels)"
        if not torch.backends.quantized.supported_engines or \
                set(torch.backends.quantized.supported_engines) <= {"none"}:
            return False, "this torch build has no quantized CPU engine (fbgemm, x86 or qnnpack)"
        return True, ""
    if not _installed(library):
        extra = "pip install 'scalekit[quant]'" if library in ("torchao", "hqq") else f"pip install {library}"
        return False, f"quantize={method!r} needs {library}, which is not installed ({extra})"
    return True, ""


def _installed(library: str) -> bool:
    try:
        return importlib.util.find_spec(library) is not None
    except (ImportError, ValueError):  # a module set to None in sys.modules (blocked), or a broken install
        return False


def as_linear(conv1d: torch.nn.Module) -> torch.nn.Linear:
    """transformers' Conv1D (GPT-2's projections: y = x·W + b, W stored (in, out)) as the nn.Linear that computes
    the same (its weight W transposed), so every quantization library, which takes nn.Linear, can take it."""
    weight = conv1d.weight.detach()
    linear = torch.nn.Linear(weight.shape[0], weight.shape[1], bias=conv1d.bias is not None, device="meta")
    linear.weight = torch.nn.Parameter(weight.t().contiguous(), requires_grad=conv1d.weight.requires_grad)
    if conv1d.bias is not None:
        linear.bias = torch.nn.Parameter(conv1d.bias.detach().clone(), requires_grad=conv1d.bias.requires_grad)
    return linear


def linearize_conv1d(model: torch.nn.Module) -> int:
    """Replace every Conv1D inside the model's blocks by its nn.Linear (as_linear); the number replaced."""
    names = block_linears(model, conv1d=True)
    swapped = 0
    for name in names:
        module = model.get_submodule(name)
        if is_conv1d(module):
            parent, _, attr = name.rpartition(".")
            setattr(model.get_submodule(parent) if parent else model, attr, as_linear(module))
            swapped += 1
    return swapped


# method -> (values per group, what is grouped): a weight whose shape does not divide is refused, naming it
GROUPED = {"hqq-8bit": (64, "values"), "hqq-4bit": (64, "values"), "hqq-2bit": (64, "values"),
           "torchao-int4": (32, "input features")}


def shape_problem(model: torch.nn.Module, method: str) -> str | None:
    """Why `method` cannot quantize one of the model's target linears (None: every one fits), in one line."""
    if method not in GROUPED:
        return None
    group, what = GROUPED[method]
    names = {id(m): n for n, m in model.named_modules()}
    for _, _, linear in target_linears(model):
        out_f, in_f = linear.weight.shape
        size = in_f if what == "input features" else out_f * in_f
        if size % group:
            return (f"quantize={method!r}: layer {names.get(id(linear), '?')} ({out_f}×{in_f} weight) does not fit: "
                    f"{METHODS[method][0]} quantizes groups of {group} {what}, and {size} is not a multiple of {group}")
    return None


def target_linears(model: torch.nn.Module) -> list[tuple[torch.nn.Module, str, torch.nn.Linear]]:
    """(parent, attribute, layer) for every linear layer to quantize (`is_linear_layer`): those inside the repeated
    blocks, or, in a model without blocks, every one whose weight is not shared with an embedding."""
    blocks = find_blocks(model)
    root = blocks if blocks is not None else model
    embedded = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    found = []
    for parent in root.modules():
        for attr, child in parent.named_children():
            if is_linear_layer(child) and id(child.weight) not in embedded:
                found.append((parent, attr, child))
    return found


def is_linear_layer(module: torch.nn.Module) -> bool:
    """An nn.Linear, or a subclass of it (Falcon's FalconLinear), that a quantizer can replace by its weights:
    - not torch's NonDynamicallyQuantizableLinear (nn.MultiheadAttention's out_proj: its parent reads the weight
      itself instead of calling the layer, so a replacement would never run);
    - holding its weight as floating-point values of its own: not a layer already quantized (bitsandbytes' int8
      and packed 4-bit Params, torchao's quantized tensors, which wrap their codes in a tensor subclass);
    - with no modules of its own: not a wrapper around a linear (torchao's FakeQuantizedLinear and its quantizers);
    - computing x·Wᵀ + b: a subclass with its own forward is run once on a probe input (`computes_linear`)."""
    if not isinstance(module, torch.nn.Linear) or isinstance(module, NonDynamicallyQuantizableLinear):
        return False
    weight = module.weight
    if not weight.is_floating_point() or is_traceable_wrapper_subclass(weight):
        return False
    if next(module.children(), None) is not None:
        return False
    return type(module).forward is torch.nn.Linear.forward or computes_linear(module)


def computes_linear(module: torch.nn.Linear) -> bool:
    """Whether a subclass's own forward gives F.linear's result (within rounding) on a random probe input: FalconLinear
    adds its bias after the matmul, the same function; a forward that scales, gates or adapts is not."""
    weight = module.weight
    if weight.is_meta or is_fake(weight):  # no values to compare (the planner's trace): taken by its type
        return True
    generator = torch.Generator(device=weight.device).manual_seed(0)
    probe = torch.randn(2, module.in_features, generator=generator, device=weight.device, dtype=weight.dtype)
    with torch.no_grad():
        try:
            out = module(probe)
        except Exception:  # noqa: BLE001 - a forward that cannot take a plain (rows, in_features) input is not linear
            return False
        expected = torch.nn.functional.linear(probe, weight, module.bias)
    if not isinstance(out, torch.Tensor) or out.shape != expected.shape:
        return False
    tolerance = 1e-4 if weight.dtype in (torch.float32, torch.float64) else 2e-2  # of the output's largest value
    return bool((out - expected).abs().max() <= tolerance * expected.abs().max().clamp_min(1e-6))


def as_plain_linear(linear: torch.nn.Linear) -> torch.nn.Linear:
    """A subclass of nn.Linear (one `is_linear_layer` accepts) as an nn.Linear holding the same Parameters: every
    quantization library takes nn.Linear, and torchao's in-place quantize_ needs nn.Linear's forward (F.linear)."""
    if type(linear) is torch.nn.Linear:
        return linear
    plain = torch.nn.Linear(linear.in_features, linear.out_features, bias=linear.bias is not None, device="meta")
    plain.weight, plain.bias = linear.weight, linear.bias
    return plain


def plain_linears(model: torch.nn.Module) -> int:
    """Replace every target linear that is a subclass of nn.Linear by `as_plain_linear`; the number replaced."""
    swapped = 0
    for parent, attr, linear in target_linears(model):
        if type(linear) is not torch.nn.Linear:
            setattr(parent, attr, as_plain_linear(linear))
            swapped += 1
    return swapped


def no_linear_why(model: torch.nn.Module) -> str:
    """Why a toggle that changes linear layers would change nothing in `model`, in one line."""
    name = type(model).__name__
    where = f"the repeated blocks of {name}" if find_blocks(model) is not None else name
    return (f"found no linear layer to change in {where}: it would leave the model as it is (it takes nn.Linear "
            f"layers, their subclasses that compute the same, and transformers' Conv1D; not layers already "
            f"quantized or wrapped, nor a weight tied to an embedding)")


def quantizable_layers(model: torch.nn.Module) -> int:
    """How many layers quantize_model would quantize, counted without changing the model."""
    conv1d = sum(is_conv1d(model.get_submodule(name)) for name in block_linears(model, conv1d=True))
    return len(target_linears(model)) + conv1d


def own_model_to_inspect(adapter) -> torch.nn.Module | None:
    """The model of your own behind a family (`adapter.source`: a module as is, a class or function built on the
    meta device), to look at before a run; None for the built-in GPT, a transformers model, or one that does not
    build on meta (the build then says what it finds)."""
    model, _ = own_model_on_meta(getattr(adapter, "source", None))
    return model


def swap_linears(model: torch.nn.Module, make: Callable[[torch.nn.Linear], torch.nn.Module]) -> int:
    """Replace each target linear by make(linear); the number replaced."""
    targets = target_linears(model)
    for parent, attr, linear in targets:
        setattr(parent, attr, make(linear))
    return len(targets)


def bnb_linear(linear: torch.nn.Module, mode: str, compute_dtype: torch.dtype, int8_threshold: float = 6.0,
               for_training: bool = False) -> torch.nn.Module:
    """A frozen bitsandbytes layer holding `linear`'s weights in `mode` ('int8', 'nf4' or 'fp4'), quantized when
    it is moved to the weight's device.  int8 is LLM.int8(): int8 rows with one fp32 scale each (SCB), and
    activation columns above `int8_threshold` kept in float (0: none); 4-bit packs two values per byte with
    an absmax per block of 64, itself quantized (nested).  for_training: a base that adapters train through
    (the quantized_base toggle) keeps the layout backward needs."""
    bnb = quiet_import("bitsandbytes")
    device, bias = linear.weight.device, linear.bias is not None
    weight = linear.weight.data.clone()
    if mode == "int8":
        layer = bnb.nn.Linear8bitLt(weight.shape[1], weight.shape[0], bias=bias, has_fp16_weights=False,
                                    threshold=int8_threshold, device="meta")
        layer.weight = bnb.nn.Int8Params(weight, requires_grad=False, has_fp16_weights=False)
    else:
        layer = bnb.nn.Linear4bit(weight.shape[1], weight.shape[0], bias=bias, compute_dtype=compute_dtype,
                                  quant_type=mode, device="meta")
        layer.weight = bnb.nn.Params4bit(weight, requires_grad=False, quant_type=mode, blocksize=64,
                                         compress_statistics=True)
        if for_training:
            # bitsandbytes repacks a 4-bit weight for AVX512-BF16 inference the first time the layer runs in eval
            # mode on such a CPU, after which training through it fails ("a view of a leaf Variable ... in-place"):
            # a base being fine-tuned is evaluated between steps, so it keeps the training layout
            layer.support_avx512bf16_for_cpu = False
    if bias:
        layer.bias = torch.nn.Parameter(linear.bias.data.clone(), requires_grad=False)
    return layer.to(device)


def hqq_linear(linear: torch.nn.Linear, compute_dtype: torch.dtype, nbits: int) -> torch.nn.Module:
    """An HQQLinear of `linear` at `nbits`, groups of 64 values.  hqq (0.2.x) starts each group from its min-max
    scale and zero point, then its default solver (`optimize_weights_proximal_legacy`) moves only the zero point,
    a few half-quadratic steps that shrink an lp-norm (p < 1) of the weight error; the scale stays min-max."""
    hqq = quiet_import("hqq.core.quantize")
    config = hqq.BaseQuantizeConfig(nbits=nbits, group_size=64)
    return hqq.HQQLinear(copy.deepcopy(linear), quant_config=config, compute_dtype=compute_dtype,
                         device=str(linear.weight.device), del_orig=True)


TORCHAO_CONFIGS = {  # method -> a function of the torchao.quantization module giving its config
    "torchao-int8": lambda q: q.Int8WeightOnlyConfig(),
    "torchao-int8-dynamic": lambda q: q.Int8DynamicActivationInt8WeightConfig(),
    "torchao-int4": lambda q: q.IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=q.PerGroup(32)),
}


def torchao_quantize(model: torch.nn.Module, method: str, device_type: str) -> int:
    """torchao's quantize_ on the target linears only (its filter sees every module; it takes ours)."""
    q = quiet_import("torchao.quantization", device_type)
    silence_known_warnings("torchao")  # a compile of the quantized model warns about torchao's tensors
    targets = {id(linear) for _, _, linear in target_linears(model)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        q.quantize_(model, TORCHAO_CONFIGS[method](q), filter_fn=lambda module, fqn: id(module) in targets)
    return len(targets)


def torch_dynamic_int8(linear: torch.nn.Linear, compute_dtype: torch.dtype) -> torch.nn.Module:
    with warnings.catch_warnings():  # torch.ao.quantization says it is deprecated, at every call
        warnings.simplefilter("ignore")
        wrapped = torch.nn.Sequential(linear)
        quantized = torch.ao.quantization.quantize_dynamic(wrapped, {torch.nn.Linear}, dtype=torch.qint8)
    return quantized[0]


def quantize_model(model: torch.nn.Module, method: str, compute_dtype: torch.dtype, device_type: str) -> int:
    """Quantize `model`'s target linears in place with `method`; the number of layers quantized.  Conv1D layers and
    subclasses of nn.Linear become nn.Linear first; a model with no such layer is refused (ToggleUnavailable: the
    toggle would change nothing), as is a layer whose shape the method's groups do not divide (ConfigError)."""
    linearize_conv1d(model)
    plain_linears(model)
    if not target_linears(model):
        raise ToggleUnavailable(toggle_why("quantize", f"={method!r} {no_linear_why(model)}"))
    problem = shape_problem(model, method)
    if problem:
        raise ConfigError(problem)
    if method.startswith("torchao-"):
        return torchao_quantize(model, method, device_type)
    makers = {
        "bnb-int8": lambda lin: bnb_linear(lin, "int8", compute_dtype),
        "bnb-nf4": lambda lin: bnb_linear(lin, "nf4", compute_dtype),
        "bnb-fp4": lambda lin: bnb_linear(lin, "fp4", compute_dtype),
        "hqq-8bit": lambda lin: hqq_linear(lin, compute_dtype, 8),
        "hqq-4bit": lambda lin: hqq_linear(lin, compute_dtype, 4),
        "hqq-2bit": lambda lin: hqq_linear(lin, compute_dtype, 2),
        "torch-dynamic-int8": lambda lin: torch_dynamic_int8(lin, compute_dtype),
    }
    return swap_linears(model, makers[method])
