"""Every toggle × every kind of model, in every loop it acts in: it runs (one step, or a few tokens), or it is
refused in one line that names the model's family and the reason.  No crash, no traceback at a user.

Toggles this machine cannot run (a GPU's, several processes') are skipped with their own reason, which must
itself be one line.  torch.compile runs with dynamo's eager backend here (the wiring, not the kernels: real
compilation is measured in test_generate_families and test_compile_equivalence)."""

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


def _hf(family):
    from scalekit.hf import causal_lm

    return causal_lm(family, preset="tiny")


MODELS = {  # name -> (training fields, generation model, the class a refusal names)
    "built-in GPT": (lambda: dict(preset="tiny", seq_len=8), lambda: "tiny", "GPT"),
    "HF GPT-2": (lambda: dict(model=_hf("gpt2"), seq_len=8), lambda: _hf("gpt2"), "GPT2LMHeadModel"),
    "HF Llama": (lambda: dict(model=_hf("llama"), seq_len=8), lambda: _hf("llama"), "LlamaForCausalLM"),
    "plain LM": (lambda: dict(model=PlainLM, batch_fn=token_pairs, loss_fn=lm_loss, tokens_per_sample=8),
                 lambda: PlainLM(), "PlainLM"),
    "ConvNet": (lambda: dict(model=ConvNet, batch_fn=image_batch, loss_fn=classify_loss),
                lambda: ConvNet(), "ConvNet"),
}
WITH = {"quantized_base": {"lora": 8}, "cpu_offload": {"fsdp": True}}  # toggles that need another one on


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    with one_thread():
        yield


@pytest.fixture(autouse=True)
def _eager_compile(monkeypatch):
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


def value_of(name: str):
    t = TOGGLES[name]
    return True if t.choices is None else t.choices[0]


def assert_ran_or_refused(status: str, error: str | None, family: str) -> None:
    if status == "ok":
        return
    assert status == "failed" and one_line(error or ""), error
    assert family in error, f"the refusal does not name {family!r}: {error}"


def _refusal(exc: Exception, family: str) -> None:
    message = str(exc)
    assert one_line(message), message
    assert family in message or "built-in GPT" in message, f"the refusal does not name {family!r}: {message}"


@pytest.mark.parametrize("model", list(MODELS))
@pytest.mark.parametrize("name", [t.name for t in ORDER if "train" in t.loops])
def test_every_training_toggle_runs_or_refuses_in_one_line(model, name):
    value = value_of(name)
    toggles = {name: value, **WITH.get(name, {})}
    for other in toggles:
        skip_if_unavailable(other, toggles[other])
    fields, _, family = MODELS[model]
    try:
        cfg = RunConfig(**fields(), toggles=toggles, batch_size=2, steps=1, warmup_steps=0, log_every=1,
                        device="cpu", measure_memory=False, check_memory=False)
    except (ConfigError, ToggleUnavailable) as exc:
        return _refusal(exc, family)
    result = run(cfg, hw=CPU, catch_errors=True)
    assert_ran_or_refused(result.status, result.error, family)


@pytest.mark.parametrize("model", list(MODELS))
@pytest.mark.parametrize("name", [t.name for t in ORDER if "generate" in t.loops])
def test_every_generation_toggle_runs_or_refuses_in_one_line(model, name):
    value = value_of(name)
    skip_if_unavailable(name, value)
    _, source, family = MODELS[model]
    try:
        cfg = GenerateConfig(model=source(), prompts=[[1, 2, 3, 4]], max_new_tokens=3, toggles={name: value},
                             device="cpu", warmup_tokens=0, measure_memory=False, quality=False)
    except (ConfigError, ToggleUnavailable) as exc:
        return _refusal(exc, family)
    result = generate(cfg, hw=CPU, catch_errors=True)
    assert_ran_or_refused(result.status, result.error, family)
    if model != "ConvNet":  # a ConvNet is not a language model: its refusal is the check
        assert result.status == "ok" and result.new_tokens == 3, result.error
