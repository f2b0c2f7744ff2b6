"""Every mode of every toggle × every kind of model, in every loop it acts in: it runs (one step, or a few tokens),
or it is refused in one line that names the model's class and the reason.  No crash, no traceback at a user.

The kinds (tests/families.py): the built-in GPT, six Hugging Face families, a plain language model of a user's own
and a ConvNet.  Anything raised but a ConfigError (ToggleUnavailable is one) fails the cell, and generation measures
quality too.  Modes this machine cannot run (a GPU's) are skipped with the toggle's own reason, which must itself be
one line; the toggles that need several processes run on 2 gloo ranks in tests/distributed/test_distributed_every_mode.py.  In
the grid torch.compile runs on dynamo's eager backend (the wiring of each mode); inductor, its real backend, compiles
a training step of each kind of model once, and a generation of each kind of decoding."""

from __future__ import annotations

import pytest

from scalekit import ConfigError, GenerateConfig, ToggleUnavailable, generate, run
from scalekit.toggles import ORDER, TOGGLES
from tests.families import MODEL_KINDS as MODELS
from tests.families import NOT_A_LANGUAGE_MODEL, WITH, modes, one_line, one_step
from tests.helpers import CPU, one_thread

pytest.importorskip("transformers")
pytestmark = pytest.mark.filterwarnings("ignore")  # libraries' own warnings (bitsandbytes' casts, peft's notes)


def cells(loop: str) -> list:
    """(toggle, mode) of every toggle acting in `loop` that runs in one process (the others: the multi-rank twin)."""
    return [pytest.param(t.name, value, id=f"{t.name}={value}") for t in ORDER if loop in t.loops
            and not t.needs_process_group for value in modes(t.name)]


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    with one_thread():
        yield


def skip_if_unavailable(name: str, value) -> None:
    t = TOGGLES[name]
    ok, why = t.choice_available(CPU, value)
    if not ok:
        assert one_line(why), why
        pytest.skip(f"{name}: {why}")


def generation(model, toggles: dict) -> GenerateConfig:
    return GenerateConfig(model=model, prompts=[[1, 2, 3, 4]], max_new_tokens=3, toggles=toggles, device="cpu",
                          warmup_tokens=0, measure_memory=False, quality=True, quality_windows=1, quality_seq_len=8)


def _refusal(exc: Exception, family: str) -> None:
    message = str(exc)
    assert one_line(message), message
    assert family in message, f"the refusal does not name {family!r}: {message}"


@pytest.mark.usefixtures("eager_compile")
@pytest.mark.parametrize("model", list(MODELS))
@pytest.mark.parametrize(("name", "value"), cells("train"))
def test_every_training_toggle_runs_or_refuses_in_one_line(model, name, value):
    toggles = {name: value, **WITH.get(name, {})}
    for other in toggles:
        skip_if_unavailable(other, toggles[other])
    fields, _, family = MODELS[model]
    try:
        cfg = one_step(fields(), toggles)
    except (ConfigError, ToggleUnavailable) as exc:
        return _refusal(exc, family)
    try:  # anything but a refusal in words is raised, and fails the cell
        result = run(cfg, hw=CPU)
    except (ConfigError, ToggleUnavailable) as exc:
        return _refusal(exc, family)
    assert result.status == "ok", (result.status, result.error)


@pytest.mark.usefixtures("eager_compile")
@pytest.mark.parametrize("model", list(MODELS))
@pytest.mark.parametrize(("name", "value"), cells("generate"))
def test_every_generation_toggle_runs_or_refuses_in_one_line(model, name, value):
    skip_if_unavailable(name, value)
    _, source, family = MODELS[model]
    generated_or_refused(source(), {name: value}, family)


def generated_or_refused(model, toggles: dict, family: str):
    """Three new tokens (every kind but the ConvNet makes them), or a one-line refusal naming `family` (None)."""
    try:  # anything but a refusal in words is raised, and fails the cell
        result = generate(generation(model, toggles), hw=CPU)
    except (ConfigError, ToggleUnavailable) as exc:
        return _refusal(exc, family)
    assert result.status == "ok" and result.new_tokens == 3, (result.status, result.error)
    return result


# inductor's runs have the shapes of the suite's other compiled training runs (8 rows of 64 tokens, no dropout:
# test_compile_equivalence, test_hf_models_learn_compiled), whose graphs inductor's cache, shared by the suite's
# processes, then compiles once for both
def causal_lm(family: str, preset: str, **kwargs):
    from scalekit.hf import causal_lm

    return causal_lm(family, preset=preset, **kwargs)


COMPILED_LIKE_ELSEWHERE = {"built-in GPT": lambda: dict(preset="tiny", batch_size=8),
                           "HF GPT-2": lambda: dict(model=causal_lm("gpt2", "tiny", dropout=0.0), batch_size=8),
                           "HF Llama": lambda: dict(model=causal_lm("llama", "tiny", dropout=0.0), batch_size=8)}
STATIC_CACHE = {"kv_cache": "static"}  # one decode graph: a cache that grows is recompiled for a dynamic length


# inductor generates on the kinds whose decoding differs in kind (the built-in cache, transformers' cache, none, and
# the refusal): each costs tens of CPU seconds, and the other families' decoding is transformers' own, as Llama's
GENERATES_WITH_INDUCTOR = ("built-in GPT", "HF GPT-2", "HF Llama", "plain LM", NOT_A_LANGUAGE_MODEL)


@pytest.mark.parametrize("model", list(MODELS))
def test_compile_with_inductor_trains(model):
    """compile on its real backend, inductor, once per kind of model: a training step."""
    skip_if_unavailable("compile", "default")
    fields = COMPILED_LIKE_ELSEWHERE.get(model, MODELS[model][0])()
    result = run(one_step(fields, {"compile": "default"}), hw=CPU, catch_errors=True)
    assert result.status == "ok" and result.graphs_compiled >= 1, (result.error, result.notes)


@pytest.mark.parametrize("model", GENERATES_WITH_INDUCTOR)
def test_compile_with_inductor_generates(model):
    """A few tokens compiled by inductor where the kind generates (a ConvNet's generation is refused, as in the grid
    above)."""
    skip_if_unavailable("compile", "default")
    _, source, family = MODELS[model]
    cache = STATIC_CACHE if model in COMPILED_LIKE_ELSEWHERE else {}  # (a plain LM has no cache)
    generated = generated_or_refused(source(), {"compile": "default", **cache}, family)
    if model != NOT_A_LANGUAGE_MODEL:
        assert generated is not None and generated.graphs_compiled >= 1, generated.notes
