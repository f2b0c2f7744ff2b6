"""The recompile trap of a compiled decode step, counted: how many graphs torch.compile makes for N steps.

A decode step whose position is a Python int is specialised on it: with `dynamic=False` every new position
is a new graph, until dynamo's recompile limit (8), after which it quietly runs the function eagerly.
Passed as a tensor, with a static cache written in place and a mask of fixed shape, every step is the same
graph.  The graphs are counted with dynamo's CompileCounter backend, which makes graphs but generates no
kernels, so the count takes a fraction of a second instead of a compile per graph.
"""

from __future__ import annotations

import torch
from torch._dynamo.testing import CompileCounter

from ..models.kv_cache import make_cache


def step_with_int_position(model, token: torch.Tensor, cache, position: int):
    """A decode step given its position as a Python int (the tensor is made inside the compiled code)."""
    return model(token, cache=cache, input_pos=torch.tensor([position], device=token.device))[0]


def step_with_tensor_position(model, token: torch.Tensor, cache, input_pos: torch.Tensor):
    """A decode step given its position as a tensor, as scalekit's decode loop does."""
    return model(token, cache=cache, input_pos=input_pos)[0]


@torch.no_grad()
def graphs_for_steps(model, steps: int, position: str = "tensor", prompt_len: int = 4) -> int:
    """Graphs torch.compile(dynamic=False) makes for `steps` decode steps of `model` (a built-in GPT) with a
    static cache, the position passed as a Python int ("int") or as a tensor updated in place ("tensor")."""
    if position not in ("int", "tensor"):
        raise ValueError(f"position must be 'int' or 'tensor', got {position!r}")
    torch._dynamo.reset()  # a clean slate: guards from earlier compiles would count against the limit
    counter = CompileCounter()
    fn = step_with_int_position if position == "int" else step_with_tensor_position
    compiled = torch.compile(fn, backend=counter, dynamic=False)
    device = next(model.parameters()).device
    cache = make_cache("static", model.config.n_layer, prompt_len + steps, device)
    prompt = torch.zeros(1, prompt_len, dtype=torch.long, device=device)
    model(prompt, cache=cache, input_pos=torch.arange(prompt_len, device=device))  # the prefill, eager
    token = torch.zeros(1, 1, dtype=torch.long, device=device)
    input_pos = torch.tensor([prompt_len], device=device)
    for i in range(steps):
        if position == "int":
            compiled(model, token, cache, prompt_len + i)
        else:
            compiled(model, token, cache, input_pos)
            input_pos += 1
    torch._dynamo.reset()
    return counter.frame_count
