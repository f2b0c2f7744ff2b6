"""ScalekitCallback: a Hugging Face Trainer run measured the way scalekit measures its own runs."""

from __future__ import annotations

import warnings

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="the Transformers bridge needs transformers installed")

from scalekit import ConfigError, RunConfig, run  # noqa: E402
from scalekit.hf import CorpusDataset, causal_lm  # noqa: E402


def ScalekitCallback(**kwargs):  # noqa: N802 - the class, imported when a test runs, not at collection
    # (it subclasses transformers' TrainerCallback, whose import brings in peft and so bitsandbytes, after which
    # scalekit.launch refuses to fork the ranks of the forking tests, which run first)
    from scalekit.hf import ScalekitCallback as cls

    return cls(**kwargs)


SEQ = 64


def trainer_run(tmp_path, callback, spec=None, max_steps=8, batch=8, **args):
    """A short Trainer run of a tiny GPT-2 on the shipped corpus on the CPU, with `callback`."""
    spec = spec or causal_lm("gpt2", "tiny", dropout=0.0)
    arguments = transformers.TrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=batch, max_steps=max_steps, logging_steps=2,
        use_cpu=True, report_to="none", save_strategy="no", disable_tqdm=True, optim="adamw_torch", **args)
    trainer = transformers.Trainer(model=spec.build(), args=arguments, train_dataset=CorpusDataset(SEQ),
                                   callbacks=[callback])
    output = trainer.train()
    return trainer, output


def test_the_callback_measures_steps_tokens_and_loss_as_the_trainer_ran_them(tmp_path):
    seen = []
    cb = ScalekitCallback(warmup_steps=3, on_step=seen.append)
    trainer, output = trainer_run(tmp_path, cb, gradient_accumulation_steps=2, batch=4)
    r = cb.result
    assert [s.step for s in r.steps] == list(range(8)) and seen == r.steps  # every step, streamed in order
    assert [s.warmup for s in r.steps] == [True] * 3 + [False] * 5 and r.step_ms.n == 5
    assert {s.tokens for s in r.steps} == {4 * 2 * SEQ} and r.tokens_per_step == 4 * 2 * SEQ  # both micro-batches
    # the loss is what the Trainer logged, read at its logging steps only (steps 2, 4, 6, 8 → indexes 1, 3, 5, 7)
    logged = [(h["step"] - 1, h["loss"]) for h in trainer.state.log_history if "loss" in h]
    assert r.losses == logged and len(logged) == 4
    assert [s.loss is not None for s in r.steps] == [i in (1, 3, 5, 7) for i in range(8)]
    assert r.final_loss == logged[-1][1]
    # each step's window lies inside the wall time of the measured steps, which lies inside the Trainer's run
    measured_s = sum(s.step_ms for s in r.steps if not s.warmup) / 1e3
    wall_s = 5 * r.tokens_per_step / r.tokens_per_s_wall
    assert 0 < measured_s <= wall_s <= output.metrics["train_runtime"]
    assert r.tokens_per_s == pytest.approx(r.tokens_per_step / (r.step_ms.median / 1e3))
    assert r.mfu is None and "n/a" in r.mfu_note  # no dense peak is known for a CPU


def test_flops_and_memory_agree_with_scalekits_own_measurement_of_the_same_model(tmp_path):
    spec = causal_lm("gpt2", "small", dropout=0.0)
    cb = ScalekitCallback(warmup_steps=2)
    trainer_run(tmp_path, cb, spec=spec, max_steps=3, batch=8, max_grad_norm=0.0)
    own = run(RunConfig(model=spec, batch_size=8, seq_len=SEQ, steps=1, warmup_steps=0, device="cpu"))
    r = cb.result
    assert r.flops_per_step == own.flops_per_step  # FlopCounterMode over the same forward and backward
    assert (r.params_bytes, r.grads_bytes, r.optimizer_state_bytes) == \
        (own.params_bytes, own.grads_bytes, own.optimizer_state_bytes)
    assert r.peak_mem_bytes == pytest.approx(own.peak_mem_bytes, rel=0.15)
    given = ScalekitCallback(warmup_steps=2, peak_tflops=1.0)
    trainer_run(tmp_path, given, spec=spec, max_steps=3, batch=8)
    assert given.result.mfu == pytest.approx(own.flops_per_step / (given.result.step_ms.median / 1e3) / 1e12)


def test_warm_up_steps_are_not_measured_and_too_few_steps_say_so(tmp_path):
    cb = ScalekitCallback(warmup_steps=4)
    trainer_run(tmp_path, cb, max_steps=4)
    assert cb.result.step_ms.n == 0 and cb.result.tokens_per_s is None
    assert "no measured steps" in cb.result.notes[0]
    with pytest.raises(ConfigError, match="warmup_steps must be an integer >= 0"):
        ScalekitCallback(warmup_steps=-1)


def test_the_lab_shows_a_trainer_run_in_its_plots_and_table(tmp_path):
    from scalekit import Lab

    lab = Lab(model=causal_lm("gpt2"), device="cpu")
    trainer_run(tmp_path, lab.trainer_callback(label="Trainer bf16", warmup_steps=1), max_steps=4, bf16=True)
    assert list(lab.results["run"]) == ["Trainer bf16"] and list(lab.results["#"]) == [1]
    assert lab.results["tokens_per_s"].iloc[0] > 0 and lab.results["batch_size"].iloc[0] == 8
    names = {trace.name for trace in lab.plots.throughput.data}
    assert names == {"#1 Trainer bf16"} and len(lab.plots.throughput.data[0].x) == 4
    assert len(lab.plots.loss.data[0].y) == 2  # logging steps 2 and 4


@pytest.mark.slow
def test_tokens_are_counted_when_the_trainer_compiles_the_model(tmp_path):
    eager = ScalekitCallback(warmup_steps=1)
    trainer_run(tmp_path, eager, max_steps=3)
    cb = ScalekitCallback(warmup_steps=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer_run(tmp_path, cb, max_steps=3, torch_compile=True)
    torch._dynamo.reset()
    assert [s.tokens for s in cb.result.steps] == [8 * SEQ] * 3  # the pre-hook fires in compiled calls too
    assert cb.result.flops_per_step == eager.result.flops_per_step  # counted as the eager model's
    # the FLOP probe's global module hooks no longer make torch warn that a compiled module's hooks fire twice
    assert not [w for w in caught if "global hooks" in str(w.message)], [str(w.message) for w in caught]
    assert not [f for f in warnings.filters if "global hooks" in str(f[1])]  # and the user's filters are as they were


def test_the_batch_recorded_counts_the_rows_a_tensor_parallel_group_shares_once():
    from types import SimpleNamespace

    from scalekit.hf.callback import _args_summary  # in the test: it imports transformers' TrainerCallback

    args = SimpleNamespace(per_device_train_batch_size=4, gradient_accumulation_steps=2, world_size=4)
    assert _args_summary(args)["batch_size"] == 4 * 2 * 4  # every process its own rows
    assert _args_summary(args, tp_size=2)["batch_size"] == 4 * 2 * 2  # 2 tensor-parallel pairs: 2 data-parallel ranks
