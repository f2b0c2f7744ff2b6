"""activation_offload: unavailable on the CPU with the reason; its mechanism (save_on_cpu) gives the same gradients,
checked through a CPU proxy (the same context, unpinned, on this machine)."""

from __future__ import annotations

import pytest
import torch

from scalekit import RunConfig, ToggleUnavailable, run
from scalekit.toggles import TOGGLES
from scalekit.toggles.activation_offload import offloaded
from scalekit.training.build import train_step
from tests.helpers import CPU, assert_same_grads, built, grads_of_one_step, tiny


def test_unavailable_on_the_cpu_with_the_reason():
    ok, why = TOGGLES["activation_offload"].available(CPU)
    assert not ok and "no device memory to save" in why and "\n" not in why
    with pytest.raises(ToggleUnavailable, match="activation_offload.*no device memory to save"):
        run(tiny(toggles=["activation_offload"]))


def test_cpu_proxy_gives_the_gradients_of_none_and_moves_every_saved_tensor():
    cfg = tiny(preset="small", batch_size=4, seq_len=32)
    with built(cfg) as ctx:
        batch = next(ctx.batches)
    plain = grads_of_one_step(cfg, batch)
    packed = []
    real = torch.autograd.graph.save_on_cpu.__init__

    def counting(self, pin_memory=False, device_type="cuda"):  # the pack hook, counted
        real(self, pin_memory, device_type)
        pack = self.pack_hook
        self.pack_hook = lambda t: (packed.append(t.numel()), pack(t))[1]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch.autograd.graph.save_on_cpu, "__init__", counting)
        with built(cfg) as ctx:
            ctx.loss_fn = offloaded(ctx.loss_fn, pin_memory=False)  # what the toggle does on a GPU, unpinned here
            names = {p: n for n, p in ctx.base_model.named_parameters()}
            seen = {}
            ctx.optimizer.register_step_pre_hook(lambda o, a, k: seen.update(
                {names[p]: p.grad.clone() for g in o.param_groups for p in g["params"]}))
            train_step(ctx, batch)
    assert_same_grads(plain, seen, atol=0)
    assert sum(packed) > 4 * 32 * 128 * 4  # every block's saved tensors went through the hook: far more than one


@pytest.mark.gpu
def test_offload_on_a_gpu_keeps_fewer_device_bytes():
    cfg = dict(preset="small", device="cuda", batch_size=16, steps=2, warmup_steps=1, log_every=1)
    plain = run(RunConfig(**cfg))
    off = run(RunConfig(**cfg, toggles=["activation_offload"]))
    assert off.status == "ok" and off.activations_bytes < plain.activations_bytes
