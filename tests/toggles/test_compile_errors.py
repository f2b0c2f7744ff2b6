"""A failure inside torch.compile (dynamo or inductor, compiling or at a compiled call) ends the run in one line that
names compile's mode, the model's class and the way out, with torch's exception chained beneath it: in training and
in generation, on the built-in GPT and a Hugging Face Llama.

torch.compile is given a backend that fails as inductor does (an InductorError wrapping an AssertionError, as
max-autotune's failure on Gemma 2 reads), or one that compiles and then fails at the first call (inductor's
CppCompileError), so no real compile runs."""

from __future__ import annotations

import pytest
import torch
from torch._inductor.exc import CppCompileError, InductorError

from scalekit import GenerateConfig, RunConfig, generate, run
from scalekit.errors import CompileFailed, compile_failure_in
from tests.families import hf_model

WHY = "max-autotune's GEMM template refused this shape"


def fails_compiling(gm, example_inputs):
    try:
        raise AssertionError(WHY)
    except AssertionError as exc:
        raise InductorError(exc, None) from exc


def fails_at_first_call(gm, example_inputs):
    def compiled(*args):
        raise CppCompileError(["g++", "kernel.cpp"], "kernel.cpp:12: error: 'vec' was not declared")

    return compiled


@pytest.fixture(params=[fails_compiling, fails_at_first_call])
def failing_backend(request, monkeypatch):
    """torch.compile (whole model, and nn.Module.compile for each block) with a backend that fails."""
    real = torch.compile

    def compile_failing(model=None, **kwargs):  # (a library's bare @torch.compile() decorator is left as it is)
        return real(**kwargs) if model is None else real(model, backend=request.param)

    monkeypatch.setattr(torch, "compile", compile_failing)
    return request.param


def training(kind: str, mode: str) -> RunConfig:
    common = dict(steps=1, warmup_steps=0, device="cpu", measure_memory=False, toggles={"compile": mode},
                  batch_size=2, seq_len=16, data="synthetic")
    return RunConfig(preset="tiny", **common) if kind == "gpt" else RunConfig(model=hf_model("llama"), **common)


def generation(kind: str, mode: str) -> GenerateConfig:
    return GenerateConfig(model="tiny" if kind == "gpt" else hf_model("llama"), prompts=[[1, 2, 3]],
                          max_new_tokens=2, device="cpu", quality=False, measure_memory=False,
                          toggles={"compile": mode})


MODEL_CLASS = {"gpt": "GPT", "llama": "LlamaForCausalLM"}


def assert_said_in_one_line(error: str, mode: str, kind: str, backend) -> None:
    assert error and "\n" not in error.strip(), error
    assert f"compile={mode!r} failed on {MODEL_CLASS[kind]}" in error, error
    assert ("AssertionError: " + WHY if backend is fails_compiling else "CppCompileError") in error, error
    ways = [m for m in ("default", "regional") if m != mode]
    assert all(f"compile={m!r}" in error for m in ways) and "without compile" in error, error


@pytest.mark.parametrize("kind, mode", [("gpt", "max-autotune"), ("llama", "regional")])
def test_a_training_run_whose_compile_fails_says_so_in_one_line(kind, mode, failing_backend):
    result = run(training(kind, mode), catch_errors=True)
    assert result.status == "failed"
    assert_said_in_one_line(result.error, mode, kind, failing_backend)


@pytest.mark.parametrize("kind, mode", [("gpt", "default"), ("llama", "max-autotune")])
def test_a_generation_whose_compile_fails_says_so_in_one_line(kind, mode, failing_backend):
    result = generate(generation(kind, mode), catch_errors=True)
    assert result.status == "failed"
    assert_said_in_one_line(result.error, mode, kind, failing_backend)


def test_raised_it_is_a_toggle_refusal_with_torch_s_exception_chained(failing_backend):
    with pytest.raises(CompileFailed) as raised:
        run(training("gpt", "max-autotune"))
    assert_said_in_one_line(str(raised.value), "max-autotune", "gpt", failing_backend)
    torch_s = compile_failure_in(raised.value.__cause__)
    assert torch_s is not None and type(torch_s).__module__.startswith(("torch._dynamo", "torch._inductor"))


def test_a_failure_that_is_not_compile_s_is_left_as_it_is(monkeypatch):
    """A compiled run whose loss_fn raises: the loss's own error, not a compile failure."""
    real = torch.compile
    monkeypatch.setattr(torch, "compile", lambda model=None, **kw: real(**kw) if model is None else
                        real(model, backend="eager"))

    def broken_loss(model, batch):
        raise RuntimeError("my loss is broken")

    cfg = training("llama", "default")
    result = run(RunConfig(**{**cfg.__dict__, "loss_fn": broken_loss}), catch_errors=True)
    assert result.status == "failed" and result.error == "RuntimeError: my loss is broken"
