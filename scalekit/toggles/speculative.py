"""Speculative decoding: a draft model (or an n-gram match in the prompt) proposes k tokens, the model checks them in one forward."""

from __future__ import annotations

from collections.abc import Mapping

from ..errors import ConfigError, ToggleUnavailable, toggle_why
from ..models.presets import PRESETS
from ..models.pretrained import PRETRAINED_NAMES, pretrained_info
from ..models.speculative import (
    DEFAULT_DRAFT,
    DEFAULT_K,
    DEFAULT_NGRAM,
    MODES,
    Speculation,
    tokenizer_mismatch,
)
from .base import BuildContext, Toggle, Tune

DRAFT_NAMES = tuple(dict.fromkeys((*PRETRAINED_NAMES, *PRESETS)))  # the shipped models, then the presets
KEYS = ("k", "ngram")  # the numbers a string value may carry: "draft,k=6", "prompt_lookup,k=8,ngram=2"
ALLOWED = ("'draft', 'prompt_lookup', 'draft=NAME,k=K', 'prompt_lookup,k=K,ngram=N', "
           "{'draft': NAME or model, 'k': K} or {'prompt_lookup': True, 'k': K, 'ngram': N}")


class Speculative(Toggle):
    name = "speculative"
    summary = "a draft (small model, or an n-gram match in the prompt) proposes k tokens; one forward of the model checks them"
    cost = "draft forwards, and k + 1 positions per verification; rejected drafts are wasted work; batch 1 only"
    helps_when = "decoding is bound by reading the weights (batch 1, a big model) and the draft agrees often"
    group = "inference"
    kind = "runtime"
    phase = "wrap"  # after the model is built: the decode loop reads ctx.speculative and builds the draft beside it
    loops = ("generate",)
    choices = MODES
    excludes = {"compile": "verifications of k + 1 tokens and drafts of varying length would each compile a new "
                           "graph; speculative decoding runs eagerly here"}
    # greedy speculative decoding must give the same tokens: autotune's floor for it is equality
    tuning = (Tune("draft", rank=90, loop="generate", label="speculative (draft)", exact=True),
              Tune("prompt_lookup", rank=95, loop="generate", label="speculative (prompt lookup)", exact=True))
    plan_note = "speculative applies to generation only (scalekit.generate): it never runs in a training step"

    def validate(self, value, owner: str = "RunConfig"):
        """True, 'draft', 'prompt_lookup', 'draft=NAME,k=K', 'prompt_lookup,k=K,ngram=N', or a dict of those; a
        dict whose draft is a model object stays a dict (a string cannot hold it)."""
        spec = parse(value, owner)
        return canonical(spec) if isinstance(spec.draft, str) else DraftModel(draft=spec.draft, k=spec.k)

    def config_applies(self, config, value) -> tuple[bool, str]:
        """A draft named by a shipped model or a preset must read the model's token ids: known from the names,
        before anything is built (a draft given as a model object is checked when it is built)."""
        spec = value if isinstance(value, Speculation) else parse(value)
        if spec.mode != "draft" or not isinstance(spec.draft, str) or not hasattr(config, "vocab_size"):
            return True, ""
        why = tokenizer_mismatch(config.vocab_size(), named_vocab_size(spec.draft), spec.draft)
        return not why, why

    def apply(self, ctx: BuildContext, value) -> None:
        spec = value if isinstance(value, Speculation) else parse(value)
        prompts = ctx.config.prompt_ids()
        if len(prompts) != 1:
            raise ConfigError(f"GenerateConfig.toggles['speculative'] decodes one prompt at a time (batch 1); "
                              f"got {len(prompts)} prompts: generate them one by one")
        ok, why = ctx.model_adapter.kv_cache_support(ctx.kv_cache) if ctx.kv_cache else (True, "")
        if not ok:
            raise ToggleUnavailable(toggle_why("kv_cache", why))
        ctx.speculative = spec  # the decode loop builds the draft model and runs the speculative loop
        ctx.notes.append(f"speculative: {describe(spec)}")


def named_vocab_size(name: str) -> int:
    """Token ids a shipped model or a preset reads, from its name alone."""
    return pretrained_info(name)["config"]["vocab_size"] if name in PRETRAINED_NAMES else PRESETS[name].vocab_size


class DraftModel(dict):
    """{'draft': a model object, 'k': K}: a value no string can hold, shown by its class in labels."""

    def __repr__(self) -> str:
        return f"draft={type(self['draft']).__name__},k={self['k']}"

    __str__ = __repr__


def describe(spec: Speculation) -> str:
    if spec.mode == "prompt_lookup":
        return f"prompt lookup, k={spec.k} tokens per verification, n-grams of {spec.ngram} down to 1"
    return f"draft model {spec.draft if isinstance(spec.draft, str) else type(spec.draft).__name__}, k={spec.k}"


def parse(value, owner: str = "GenerateConfig") -> Speculation:
    """A user's value as a Speculation; ConfigError naming the field and what it allows."""
    where = f"{owner}.toggles['speculative']"
    if value is True:
        value = MODES[0]
    if isinstance(value, Speculation):
        return value
    if isinstance(value, str):
        return _parse_text(value, where)
    if isinstance(value, Mapping):
        return _parse_mapping(value, where)
    raise ConfigError(f"{where} must be one of {ALLOWED}; got {value!r}")


def _parse_text(text: str, where: str) -> Speculation:
    head, *rest = [part.strip() for part in text.split(",")]
    mode, _, draft = head.partition("=")
    numbers = {}
    for part in rest:
        key, _, number = part.partition("=")
        if key not in KEYS or not number.isdigit():
            raise ConfigError(f"{where} must be one of {ALLOWED}; got {text!r} ({part!r} is not k=K or ngram=N)")
        numbers[key] = int(number)
    fields = {"mode": mode, **numbers}
    if draft:
        fields["draft"] = draft
    return _checked(fields, where, text)


def _parse_mapping(value: Mapping, where: str) -> Speculation:
    unknown = set(value) - {"draft", "prompt_lookup", "k", "ngram"}
    if unknown or ("draft" in value) == bool(value.get("prompt_lookup")):
        raise ConfigError(f"{where} must be one of {ALLOWED}; got {dict(value)!r}")
    fields = {key: value[key] for key in KEYS if key in value}
    if "draft" in value:
        fields.update(mode="draft", draft=value["draft"])
    else:
        fields["mode"] = "prompt_lookup"
    return _checked(fields, where, value)


def _checked(fields: dict, where: str, said) -> Speculation:
    if fields["mode"] not in MODES:
        raise ConfigError(f"{where} must be one of {ALLOWED}; got {said!r}")
    for key, low, high in (("k", 1, 64), ("ngram", 1, 16)):
        number = fields.get(key, DEFAULT_K if key == "k" else DEFAULT_NGRAM)
        if isinstance(number, bool) or not isinstance(number, int) or not low <= number <= high:
            raise ConfigError(f"{where}: {key} must be a whole number from {low} to {high}; got {number!r}")
    if fields["mode"] == "prompt_lookup" and "draft" in fields:
        raise ConfigError(f"{where}: prompt_lookup takes no draft model; got {said!r}")
    draft = fields.get("draft", DEFAULT_DRAFT)
    if draft is None or (isinstance(draft, str) and draft not in DRAFT_NAMES):
        raise ConfigError(f"{where}: draft must be a model (an nn.Module, a Hugging Face model or config) or one "
                          f"of {', '.join(DRAFT_NAMES)}; got {draft!r}")
    return Speculation(**{**fields, "draft": draft})


def canonical(spec: Speculation) -> str:
    """The shortest string that parses back to `spec` (defaults left out): what labels and JSON show."""
    head = spec.mode if spec.draft == DEFAULT_DRAFT or spec.mode != "draft" else f"draft={spec.draft}"
    extra = [f"k={spec.k}"] if spec.k != DEFAULT_K else []
    if spec.mode == "prompt_lookup" and spec.ngram != DEFAULT_NGRAM:
        extra.append(f"ngram={spec.ngram}")
    return ",".join([head, *extra])


TOGGLE = Speculative()
