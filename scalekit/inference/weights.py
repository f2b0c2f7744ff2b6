"""Bytes a model's weights hold, counted from the tensors themselves, quantized formats included.

Counted: every parameter and persistent buffer, the tensors quantization libraries keep beside them (a
bitsandbytes weight's scales and quantization state, HQQ's per-group scales and zeros held in a dict on the
layer, and its bias, a plain tensor attribute), the inner tensors of tensor subclasses (torchao's int8/int4 weights: data, scales, zero points),
and torch's dynamically quantized Linear (its packed int8 weight, read back as a quantized tensor).  Each
storage is counted once, so tied weights (the built-in GPT's embedding and output head) count once.  Not
counted: non-persistent buffers, which are not weights (the built-in GPT's causal mask).
"""

from __future__ import annotations

import torch

from ..measure.memory import storage_key


def _leaves(obj, depth: int = 0):
    """Plain tensors inside `obj`: a tensor subclass's inner tensors, a dict's or list's values, and the
    tensor-valued attributes of quantization-state objects (bitsandbytes' QuantState), a few levels deep."""
    if depth > 4 or obj is None:
        return
    if isinstance(obj, torch.Tensor):
        flatten = getattr(type(obj), "__tensor_flatten__", None)
        if flatten is not None and type(obj) not in (torch.Tensor, torch.nn.Parameter):
            names, _ = obj.__tensor_flatten__()
            for name in names:
                yield from _leaves(getattr(obj, name), depth + 1)
            return
        if obj.is_quantized:  # a torch quantized tensor: its integer values (and per-channel scales)
            yield obj.int_repr()
            if obj.qscheme() in (torch.per_channel_affine, torch.per_channel_symmetric):
                yield obj.q_per_channel_scales()
                yield obj.q_per_channel_zero_points()
            return
        yield obj
        for value in vars(obj).values() if hasattr(obj, "__dict__") else ():  # bitsandbytes' SCB, quant_state
            if isinstance(value, (torch.Tensor, dict, list, tuple)) or hasattr(value, "__dict__"):
                yield from _leaves(value, depth + 1)
        return
    if isinstance(obj, dict):
        for value in obj.values():
            yield from _leaves(value, depth + 1)
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            yield from _leaves(value, depth + 1)
    elif hasattr(obj, "__dict__") and not isinstance(obj, (torch.nn.Module, type)):
        for value in vars(obj).values():
            if isinstance(value, (torch.Tensor, dict, list, tuple)) or hasattr(value, "__dict__"):
                yield from _leaves(value, depth + 1)


def _module_tensors(module: torch.nn.Module):
    """The tensors one module holds as weights (not its children's)."""
    yield from _leaves(list(module._parameters.values()))
    persistent = {k: v for k, v in module._buffers.items() if k not in module._non_persistent_buffers_set}
    yield from _leaves(list(persistent.values()))
    # torch's dynamically quantized Linear keeps its int8 weight and bias packed in a LinearPackedParams child
    # (the Linear's own _weight_bias reads the same one: counted here only)
    if type(module).__name__ == "LinearPackedParams" and type(module).__module__.startswith("torch.ao.nn.quantized"):
        yield from _leaves(list(module._weight_bias()))
    meta = getattr(module, "meta", None)  # HQQLinear keeps its scales and zeros in a dict
    if isinstance(meta, dict):
        yield from _leaves(meta)
    # tensors held as plain attributes, outside the parameters and buffers (HQQLinear's bias)
    yield from (v for k, v in vars(module).items() if isinstance(v, torch.Tensor) and not k.startswith("_"))


def _storages(model: torch.nn.Module) -> dict[int, tuple[str, int]]:
    """storage key -> (dtype, bytes) for every weight storage of `model`."""
    held = [t for module in model.modules() for t in _module_tensors(module) if t.device.type != "meta"]
    # `held` keeps every tensor alive while the keys are read: a temporary (torch's int_repr) freed early
    # could hand its address, and so its key, to the next one
    return {storage_key(t.untyped_storage()): (str(t.dtype).removeprefix("torch."), t.untyped_storage().nbytes())
            for t in held}


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of the model's weights in the formats they are stored in, each storage once."""
    return sum(n for _, n in _storages(model).values())


def weight_bytes_by_dtype(model: torch.nn.Module) -> dict[str, int]:
    """The same bytes split by the dtype they are stored in (int8, uint8, float32, ...)."""
    out: dict[str, int] = {}
    for dtype, n in _storages(model).values():
        out[dtype] = out.get(dtype, 0) + n
    return out
