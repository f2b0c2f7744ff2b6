"""torch.compile changes how the model runs, not what it computes."""

from __future__ import annotations

import pytest
import torch

from scalekit import run
from tests.helpers import built, learns, tiny

STEPS = dict(steps=30, warmup_steps=1, log_every=5)


@pytest.mark.slow
def test_compiled_and_eager_losses_agree_after_n_steps():
    kwargs = dict(steps=8, warmup_steps=0, log_every=1, measure_memory=False)
    eager = run(tiny(**kwargs))
    compiled = run(tiny(toggles=["compile"], **kwargs))
    assert len(eager.losses) == len(compiled.losses) == 8
    for (step_e, loss_e), (step_c, loss_c) in zip(eager.losses, compiled.losses, strict=True):
        assert step_e == step_c
        assert loss_c == pytest.approx(loss_e, rel=1e-4, abs=1e-4)
    assert eager.final_loss < eager.losses[0][1]  # both really trained
    # compile captured the model whole: one graph (forward and backward), no break, no recompile after step 0
    assert (compiled.graphs_compiled, compiled.graph_breaks, compiled.recompiles_measured) == (1, 0, 0)
    assert not any("compile" in note for note in compiled.notes), compiled.notes


@pytest.mark.slow
def test_compile_wraps_the_model_and_learns():
    with built(tiny(toggles={"compile": "default"})) as ctx:
        assert isinstance(ctx.model, torch._dynamo.eval_frame.OptimizedModule)
        assert ctx.model._orig_mod is ctx.base_model
    result = run(tiny(toggles=["compile"], **STEPS))
    assert learns(result)
    assert result.compile_s is not None and result.compile_s > 0
