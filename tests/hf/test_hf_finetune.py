"""Fine-tuning a Hugging Face model with scalekit's adapters: GPT-2 (whose projections are transformers'
Conv1D, weights stored (in, out)) and Llama (nn.Linear).  What trains is exactly r·(in + out) per adapted
layer, the base does not move, adapters save, load and merge to the same logits, and the planner agrees."""

from __future__ import annotations

import contextlib
import importlib.util

import pytest
import torch

pytest.importorskip("transformers", reason="Hugging Face models need transformers installed")
if importlib.util.find_spec("peft") is None:  # looked up, not imported: peft imports bitsandbytes, after which
    pytest.skip("LoRA needs peft installed", allow_module_level=True)  # the forking tests (run first) may not fork

from scalekit import RunConfig, estimate, run
from scalekit.hf import causal_lm  # noqa: E402
from scalekit.models import lora_files as adapters  # noqa: E402
from scalekit.models.blocks import block_linears, is_conv1d  # noqa: E402
from scalekit.training.build import build, train_step  # noqa: E402
from tests.helpers import CPU  # noqa: E402

FAMILIES = ["gpt2", "llama"]


def config(family: str, toggles: dict, **kw) -> RunConfig:
    return RunConfig(model=causal_lm(family, "tiny"), toggles=toggles, batch_size=4, seq_len=64, steps=3,
                     warmup_steps=1, device="cpu", **kw)


@contextlib.contextmanager
def built(cfg: RunConfig):
    with contextlib.ExitStack() as stack:
        yield build(cfg.resolve(CPU), CPU, stack)


def in_out(module) -> tuple[int, int]:
    if is_conv1d(module):
        rows, cols = module.weight.shape  # Conv1D: (in, out)
        return rows, cols
    return module.in_features, module.out_features


@pytest.mark.parametrize("family", FAMILIES)
def test_lora_trains_r_times_in_plus_out_per_layer_of_the_blocks(family):
    with built(config(family, {"lora": 4})) as ctx:
        targets = block_linears(causal_lm(family, "tiny").build(), conv1d=True)
        assert targets  # GPT-2's Conv1D layers count
        modules = dict(ctx.base_model.named_modules())
        expected = sum(4 * sum(in_out(modules[t].base_layer)) for t in targets)
        trainable = sum(p.numel() for p in ctx.model.parameters() if p.requires_grad)
        assert trainable == expected


@pytest.mark.parametrize("family", FAMILIES)
def test_the_base_does_not_move_and_merged_logits_equal_unmerged(family, tmp_path):
    with built(config(family, {"lora": 8}, lr=1e-2)) as ctx:
        frozen = {n: p.detach().clone() for n, p in ctx.base_model.named_parameters() if not p.requires_grad}
        learned = {n: p.detach().clone() for n, p in ctx.base_model.named_parameters() if p.requires_grad}
        for _ in range(3):
            train_step(ctx, next(ctx.batches))
        params = dict(ctx.base_model.named_parameters())
        assert frozen and all(torch.equal(params[n], p) for n, p in frozen.items())
        assert any(not torch.equal(params[n], p) for n, p in learned.items())
        path = tmp_path / "adapters.pt"
        adapters.save(ctx.model, path)
        x = next(ctx.batches)["input_ids"]
        ctx.model.eval()
        expected = ctx.model(input_ids=x).logits.detach()
        diff, merged = adapters.merge_logit_difference(ctx.model, x)
    assert diff < 1e-4  # a float base: the same logits up to rounding (a transposed Conv1D update would not be)
    assert not any("lora" in n for n, _ in merged.named_parameters())
    with built(config(family, {"lora": 8})) as fresh:
        adapters.load(fresh.model, path)
        fresh.model.eval()
        assert torch.equal(fresh.model(input_ids=x).logits, expected)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_lora_run_reports_what_trains_and_the_planner_agrees(family):
    cfg = config(family, {"lora": 8})
    result = run(cfg)
    assert result.status == "ok", result.error
    assert 0 < result.trainable_params < result.total_params
    planned = estimate(cfg, device="cpu").peak_bytes
    assert abs(planned - result.peak_mem_bytes) / result.peak_mem_bytes < 0.05
