"""Every mode of every toggle × every kind of model, in every loop it acts in: it runs (one step, or a few tokens),
or it is refused in one line that names the model's class and the reason.  No crash, no traceback at a user.

Modes this machine cannot run (a GPU's, several processes') are skipped with the toggle's own reason, which must
itself be one line.  In the grid torch.compile runs on dynamo's eager backend (the wiring of each mode); inductor,
its real backend, compiles a training step and a generation of each kind of model once, in the last test."""

from __future__ import annotations

import pytest
import torch

from scalekit import ConfigError, GenerateConfig, RunConfig, ToggleUnavailable, generate, run
from scalekit.toggles import ORDER, TOGGLES
from tests.helpers import CPU, ConvNet, classify_loss, image_batch, one_thread

pytest.importorskip("transformers")
pytestmark = pytest.mark.filterwarnings("ignore")  # libraries' own warnings (bitsandbytes' casts, peft's notes)


class PlainLM(torch.nn.Module):
    """A language model of a user's own: embedding, repeated residual blocks of linears, a head; no cache."""

    def __init__(self, vocab: int = 65, d: int = 32, layers: int = 2):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, d)
        self.blocks = torch.nn.ModuleList([torch.nn.Sequential(torch.nn.Linear(d, 64), torch.nn.GELU(),
                                                               torch.nn.Linear(64, d)) for _ in range(layers)])
        self.head = torch.nn.Linear(d, vocab)

    def forward(self, idx):
        x = self.emb(idx)
        for block in self.blocks:
            x = x + block(x)
        return self.head(x)


def token_pairs(batch_size, device):
    xy = torch.randint(0, 65, (batch_size, 9), device=device)
    return xy[:, :-1], xy[:, 1:]


def lm_loss(model, batch):
    x, y = batch
    return torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())


def causal_lm(family, preset="tiny", **kwargs):
    from scalekit.hf import causal_lm

    return causal_lm(family, preset=preset, **kwargs)


MODELS = {  # name -> (training fields, generation model, the class a refusal names)
    "built-in GPT": (lambda: dict(preset="tiny", seq_len=8), lambda: "tiny", "GPT"),
    "HF GPT-2": (lambda: dict(model=causal_lm("gpt2"), seq_len=8), lambda: causal_lm("gpt2"), "GPT2LMHeadModel"),
    "HF Llama": (lambda: dict(model=causal_lm("llama"), seq_len=8), lambda: causal_lm("llama"), "LlamaForCausalLM"),
    "plain LM": (lambda: dict(model=PlainLM, batch_fn=token_pairs, loss_fn=lm_loss, tokens_per_sample=8),
                 lambda: PlainLM(), "PlainLM"),
    "ConvNet": (lambda: dict(model=ConvNet, batch_fn=image_batch, loss_fn=classify_loss),
                lambda: ConvNet(), "ConvNet"),
}
NOT_A_LANGUAGE_MODEL = "ConvNet"
WITH = {"quantized_base": {"lora": 8}, "cpu_offload": {"fsdp": True}}  # toggles that need another one on
BATCH = 4  # rows per step: both grad_accum counts below divide it

# A count stands for one code path whatever its size: the smallest and the largest a toggle offers (the largest is
# past the tiny models' sizes: more loss chunks than tokens, a LoRA rank above the width), except where that costs
# more than it shows here.  Counts the run's shape cannot take are the batch check's to refuse (test_config).
COUNTS = {"dataloader_num_workers": (1, 2),  # each worker is a forked process: two say "several" as well as eight
          "grad_accum": (2, BATCH)}


def modes(name: str) -> list:
    """Every mode of toggle `name` a cell tries: True for an on/off toggle, each word, and representative counts."""
    choices = TOGGLES[name].choices
    if choices is None:
        return [True]
    counts = [c for c in choices if isinstance(c, int)]
    words = [c for c in choices if not isinstance(c, int)]
    return [*COUNTS.get(name, sorted({min(counts), max(counts)}) if counts else ()), *words]


def cells(loop: str) -> list:
    return [pytest.param(t.name, value, id=f"{t.name}={value}") for t in ORDER if loop in t.loops
            for value in modes(t.name)]


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    with one_thread():
        yield


@pytest.fixture
def eager_compile(monkeypatch):
    """torch.compile on dynamo's eager backend: the wiring of every compile mode, not inductor's kernels (each a
    g++ run of most of a second), which test_compile_with_inductor_trains_and_generates builds once per model."""
    real = torch.compile

    def eager(model=None, **kwargs):  # (libraries also call torch.compile as a decorator factory)
        kwargs.pop("mode", None)
        kwargs["backend"] = "eager"
        return real(model, **kwargs) if model is not None else real(**kwargs)

    monkeypatch.setattr(torch, "compile", eager)


def one_line(text: str) -> bool:
    return bool(text) and "\n" not in text.strip() and "Traceback" not in text


def skip_if_unavailable(name: str, value) -> None:
    t = TOGGLES[name]
    ok, why = t.available(CPU) if t.choices is None else t.choice_available(CPU, value)
    if not ok:
        assert one_line(why), why
        pytest.skip(f"{name}: {why}")


def training(fields: dict, toggles: dict) -> RunConfig:
    """One step, nothing measured but the step: each cell as cheap as a run can be."""
    return RunConfig(**{"batch_size": BATCH, **fields}, toggles=toggles, steps=1, warmup_steps=0, log_every=1,
                     device="cpu", measure_memory=False, check_memory=False)


def generation(model, toggles: dict) -> GenerateConfig:
    return GenerateConfig(model=model, prompts=[[1, 2, 3, 4]], max_new_tokens=3, toggles=toggles, device="cpu",
                          warmup_tokens=0, measure_memory=False, quality=False)


def assert_ran_or_refused(status: str, error: str | None, family: str) -> None:
    if status == "ok":
        return
    assert status == "failed" and one_line(error or ""), error
    assert family in error, f"the refusal does not name {family!r}: {error}"


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
        cfg = training(fields(), toggles)
    except (ConfigError, ToggleUnavailable) as exc:
        return _refusal(exc, family)
    result = run(cfg, hw=CPU, catch_errors=True)
    assert_ran_or_refused(result.status, result.error, family)


@pytest.mark.usefixtures("eager_compile")
@pytest.mark.parametrize("model", list(MODELS))
@pytest.mark.parametrize(("name", "value"), cells("generate"))
def test_every_generation_toggle_runs_or_refuses_in_one_line(model, name, value):
    skip_if_unavailable(name, value)
    _, source, family = MODELS[model]
    generated_or_refused(source(), {name: value}, family)


def generated_or_refused(model, toggles: dict, family: str):
    """Three new tokens (every kind but the ConvNet makes them), or a one-line refusal naming `family` (None)."""
    try:
        cfg = generation(model, toggles)
    except (ConfigError, ToggleUnavailable) as exc:
        return _refusal(exc, family)
    result = generate(cfg, hw=CPU, catch_errors=True)
    assert_ran_or_refused(result.status, result.error, family)
    if family != MODELS[NOT_A_LANGUAGE_MODEL][2]:  # a ConvNet is not a language model: its refusal is the check
        assert result.status == "ok" and result.new_tokens == 3, result.error
    return result if result.status == "ok" else None


# inductor's runs have the shapes of the suite's other compiled training runs (8 rows of 64 tokens, no dropout:
# test_compile_equivalence, test_hf_models_learn_compiled), whose graphs inductor's cache, shared by the suite's
# processes, then compiles once for both
COMPILED_LIKE_ELSEWHERE = {"built-in GPT": lambda: dict(preset="tiny", batch_size=8),
                           "HF GPT-2": lambda: dict(model=causal_lm("gpt2", "tiny", dropout=0.0), batch_size=8),
                           "HF Llama": lambda: dict(model=causal_lm("llama", "tiny", dropout=0.0), batch_size=8)}
STATIC_CACHE = {"kv_cache": "static"}  # one decode graph: a cache that grows is recompiled for a dynamic length


@pytest.mark.parametrize("model", list(MODELS))
def test_compile_with_inductor_trains_and_generates(model):
    """compile on its real backend, inductor, once per kind of model: a training step, and a few tokens where
    the kind generates (a ConvNet's generation is refused, as in the grid above)."""
    skip_if_unavailable("compile", "default")
    fields, source, family = MODELS[model]
    fields = COMPILED_LIKE_ELSEWHERE.get(model, fields)()
    result = run(training(fields, {"compile": "default"}), hw=CPU, catch_errors=True)
    assert result.status == "ok" and result.graphs_compiled >= 1, (result.error, result.notes)
    cache = STATIC_CACHE if model in COMPILED_LIKE_ELSEWHERE else {}  # (a plain LM has no cache)
    generated = generated_or_refused(source(), {"compile": "default", **cache}, family)
    if model != NOT_A_LANGUAGE_MODEL:
        assert generated is not None and generated.graphs_compiled >= 1, generated.notes
