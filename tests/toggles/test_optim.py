"""The optim toggle: every optimizer trains; 8-bit state is uint8; Adafactor's state is factored."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

from scalekit import ConfigError, RunConfig, ToggleUnavailable, run
from scalekit.toggles import optim as optim_mod
from scalekit.toggles.optim import EIGHT_BIT, OPTIMIZERS, make_optimizer
from scalekit.training.build import train_step
from tests.helpers import CPU, built, learns, tiny

STEPS = dict(steps=20, warmup_steps=1, log_every=5)



@pytest.mark.filterwarnings("ignore:Paged optimizers are not supported on CPU")  # said in the run's notes
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_every_optimizer_trains(name):
    result = run(tiny(toggles={"optim": name}, **STEPS))
    assert result.status == "ok", result.error
    assert learns(result), result.losses


def test_torch_adamw_flavours_make_what_they_say():
    params = [torch.nn.Parameter(torch.randn(4, 4))]
    assert make_optimizer("adamw_torch_fused", params, lr=1e-3).defaults["fused"] is True
    assert make_optimizer("adamw_torch_foreach", params, lr=1e-3).defaults["foreach"] is True
    plain = make_optimizer("adamw_torch", params, lr=1e-3).defaults
    assert not plain["fused"] and plain["foreach"] is None  # torch's own default choice


def test_eight_bit_state_is_uint8_and_about_2_bytes_per_parameter():
    # small preset: most weights are in matrices of ≥4096 values, the ones bitsandbytes quantizes
    cfg = dict(preset="small", batch_size=2, seq_len=32, steps=1, warmup_steps=0)
    adamw = run(tiny(**cfg))
    adam8 = run(tiny(**cfg, toggles={"optim": "adamw_bnb_8bit"}))
    lion8 = run(tiny(**cfg, toggles={"optim": "lion_8bit"}))
    n_params = adamw.grads_bytes / 4
    assert adamw.optimizer_state_bytes / n_params == pytest.approx(8.0, abs=0.01)
    assert adam8.optimizer_state_bytes / n_params == pytest.approx(2.0, abs=0.3)
    assert lion8.optimizer_state_bytes / n_params == pytest.approx(1.0, abs=0.2)
    with built(tiny(**cfg, toggles={"optim": "adamw_bnb_8bit"})) as ctx:
        train_step(ctx, next(ctx.batches))
        model, state = ctx.base_model, ctx.optimizer.state
        c_fc = model.transformer.h[0].mlp.c_fc.weight
        assert state[c_fc]["state1"].dtype == torch.uint8 and state[c_fc]["state2"].dtype == torch.uint8
        # the token embedding (tied to lm_head) keeps 32-bit state
        assert state[model.transformer.wte.weight]["state1"].dtype == torch.float32


def test_adafactor_state_grows_sublinearly_with_the_weight_matrices():
    def state_bytes(n: int) -> int:
        w = torch.nn.Parameter(torch.randn(n, n))
        opt = make_optimizer("adafactor", [w], lr=1e-3)
        w.grad = torch.randn_like(w)
        opt.step()
        return sum(v.untyped_storage().nbytes() for v in opt.state[w].values() if isinstance(v, torch.Tensor))

    small, large = state_bytes(256), state_bytes(1024)
    assert large / small == pytest.approx(4, rel=0.05)  # 16× the weights, 4× the state: a row and a column
    assert large < 0.01 * 1024 * 1024 * 4  # under 1% of the matrix's own bytes


def test_stable_embedding_is_tied_trained_and_its_overrides_are_removed_after():
    import bitsandbytes as bnb

    manager = bnb.optim.GlobalOptimManager.get_instance()
    before = len(manager.module_weight_config_triple)
    with built(tiny(toggles={"optim": "adamw_bnb_8bit"})) as ctx:
        model = ctx.base_model
        wte = model.transformer.wte
        assert isinstance(wte, bnb.nn.StableEmbedding)
        assert model.lm_head.weight is wte.weight and wte.weight.requires_grad
        start = wte.weight.detach().clone()
        train_step(ctx, next(ctx.batches))
        assert not torch.equal(start, wte.weight)  # it learns
        assert len(manager.module_weight_config_triple) == before + 1
    assert len(manager.module_weight_config_triple) == before


def test_your_own_models_embeddings_keep_32bit_state():
    class Bag(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(512, 16)
            self.out = torch.nn.Linear(16, 512)

        def forward(self, x):
            return self.out(self.emb(x))

    def batch_fn(b, device):
        x = torch.randint(0, 512, (b, 8), device=device)
        return x, x

    def loss_fn(model, batch):
        x, y = batch
        return torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())

    cfg = tiny(model=Bag, batch_fn=batch_fn, loss_fn=loss_fn, toggles={"optim": "adamw_bnb_8bit"})
    with built(cfg) as ctx:
        train_step(ctx, batch_fn(8, torch.device("cpu")))
        state = ctx.optimizer.state
        assert state[ctx.base_model.emb.weight]["state1"].dtype == torch.float32  # registered 32-bit
        assert state[ctx.base_model.out.weight]["state1"].dtype == torch.uint8


def test_optim_and_fused_adamw_are_exclusive_and_choices_are_named():
    with pytest.raises(ConfigError, match="'optim' and 'fused_adamw' cannot be on together.*adamw_torch_fused"):
        RunConfig(toggles={"optim": "adamw_torch", "fused_adamw": True})
    with pytest.raises(ConfigError, match="must be True or one of.*'lion_8bit'.*got 'sgd'"):
        RunConfig(toggles={"optim": "sgd"})


def test_missing_bitsandbytes_is_explained(monkeypatch):
    real = optim_mod.importlib.util.find_spec
    monkeypatch.setattr(optim_mod.importlib.util, "find_spec",
                        lambda name, *a: None if name == "bitsandbytes" else real(name, *a))
    for name in EIGHT_BIT:
        ok, why = optim_mod.TOGGLE.choice_available(CPU, name)
        assert not ok and "bitsandbytes" in why and "not installed" in why
    assert optim_mod.TOGGLE.choice_available(CPU, "adamw_torch_fused") == (True, "")
    with pytest.raises(ToggleUnavailable, match="needs bitsandbytes"):
        run(tiny(toggles={"optim": "lion_8bit"}))


def test_bitsandbytes_is_imported_only_for_an_8bit_optimizer():
    code = textwrap.dedent("""
        import sys
        from scalekit import RunConfig, run
        run(RunConfig(preset="tiny", device="cpu", steps=1, warmup_steps=0, toggles={"optim": "adafactor"}))
        assert "bitsandbytes" not in sys.modules, "imported too early"
        run(RunConfig(preset="tiny", device="cpu", steps=1, warmup_steps=0, toggles={"optim": "lion_8bit"}))
        assert "bitsandbytes" in sys.modules
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "kernels" not in done.stdout + done.stderr  # bitsandbytes' import note is kept out of the output
