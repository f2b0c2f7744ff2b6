"""GenerateConfig: one measured generation, validated up front with errors that name the field."""

from __future__ import annotations

import dataclasses
import functools
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ..checks import check_bool, check_device, check_label, check_threads, int_in
from ..data import CharTokenizer, corpus_text, split_text
from ..errors import ConfigError, ToggleUnavailable, toggle_why
from ..hf.checkpoint_folder import HFCheckpoint, checkpoint_model, tokenizer_problem
from ..hf.family_of import generation_family, is_hf_source
from ..models.import_spec import import_named_code
from ..models.presets import PRESETS
from ..models.pretrained import PRETRAINED_NAMES
from ..toggles import TOGGLES, check_combination, normalise

# the shipped model(s), then the presets (random weights); a preset named like a shipped model is that model
MODEL_NAMES = tuple(dict.fromkeys((*PRETRAINED_NAMES, *PRESETS)))
MAX_PROMPTS = 4096


@dataclass
class GenerateConfig:
    """A model, prompts, how many tokens to generate and how, and the toggles switched on."""

    model: Any = "shakespeare-char"
    """'shakespeare-char' (the shipped model), a preset ('tiny', 'small', 'medium', 'gpt2-124m': random
    weights from `seed`), a Hugging Face causal LM (a PreTrainedModel, a transformers config, or
    scalekit.hf.causal_lm(...), or the path of a checkpoint folder save_pretrained wrote: loaded offline, prompts
    read with its tokenizer), or your own model (a module, or a function building one) whose forward(idx)
    returns logits (B, T, V), a tuple that starts with them, or an object with `.logits`; it gets a KV cache
    when it follows one of the conventions of scalekit.models.conventions."""
    prompts: str | Sequence[str] | Sequence[Sequence[int]] = "ROMEO:"
    """One prompt, or a batch of them (text, or lists of token ids); prompts of different lengths are left-padded."""
    max_new_tokens: int | None = None
    """Tokens generated after each prompt (None: 200, cut to what the model's context leaves after the longest)."""
    temperature: float = 0.0
    """0: greedy (the most likely token every step); above 0: sampled from softmax(logits / temperature)."""
    top_k: int | None = None
    """With sampling, only the k most likely tokens are drawn from (None: all)."""
    seed: int = 1337
    """Seed for sampling, and for a preset's random weights."""
    toggles: Mapping[str, Any] | Sequence[str] = field(default_factory=dict)
    """Inference optimizations to switch on: names or {name: True | mode}, e.g. {"kv_cache": "static"}."""
    device: str = "auto"
    """'auto' (first GPU, else CPU), 'cpu', 'cuda' or 'cuda:N'."""
    warmup_tokens: int = 8
    """New tokens of an unmeasured warm-up generation first (compilation happens there); 0: none."""
    quality: bool = True
    """Measure perplexity on held-out tokens and greedy agreement with the model as built."""
    quality_windows: int = 8
    """Held-out windows the quality measures read."""
    quality_seq_len: int | None = None
    """Tokens per held-out window (at most the model's context); None: 256, cut to the model's context."""
    quality_tokens: Any = None
    """Held-out token ids for perplexity and agreement (a 1-D list or tensor); None: the shipped corpus'
    validation split, where the model's vocabulary holds its characters (a checkpoint folder's model: that split
    read with the folder's tokenizer)."""
    measure_memory: bool = True
    """On CPU, count live tensor bytes over one extra, unmeasured generation for the peak memory."""
    tokenizer: Any = None
    """Something with encode(str) -> ids and decode(ids) -> str; None: the shipped corpus' characters (a
    checkpoint folder's model: the folder's tokenizer)."""
    label: str | None = None
    """Name of the run in tables and plots (None: made from the toggles)."""
    threads: int | None = None
    """torch's intra-op threads for the generation, restored after it (None: the cores other processes are not
    already using, at least one and at most torch's own setting, decided once per process)."""

    def __post_init__(self) -> None:
        self.toggles = normalise(self.toggles, "GenerateConfig", loop="generate")
        check_combination(self.toggles, "GenerateConfig")
        if isinstance(self.prompts, str):
            self.prompts = [self.prompts]
        elif isinstance(self.prompts, Sequence):
            self.prompts = [p if isinstance(p, str) else list(p) if isinstance(p, Sequence) else p
                            for p in self.prompts]
        self._checkpoint_folder()
        if self.max_new_tokens is None:
            self.max_new_tokens = self._fitting_new_tokens()
        self.validate()

    def _fitting_new_tokens(self) -> int:
        """DEFAULT_NEW_TOKENS, cut so that the longest prompt and they fit the model's context (a preset's
        default: 58 new tokens after 'ROMEO:' for the 64 positions of 'tiny')."""
        self._validate_tokenizer()
        self._validate_model()
        self._validate_prompts()
        context = self.context_length()
        if context is None:
            return DEFAULT_NEW_TOKENS
        return max(1, min(DEFAULT_NEW_TOKENS, context - max(len(p) for p in self.prompt_ids())))

    # -- validation --------------------------------------------------------------------------------
    def validate(self) -> None:
        self._validate_tokenizer()
        self._validate_model()
        self._validate_prompts()
        for name, (low, high) in INT_RANGES.items():
            if getattr(self, name) is not None or name != "quality_seq_len":
                int_in("GenerateConfig", name, getattr(self, name), low, high)
        if self.top_k is not None:
            int_in("GenerateConfig", "top_k", self.top_k, 1, 2**31)
        if isinstance(self.temperature, bool) or not isinstance(self.temperature, numbers.Real) \
                or not 0 <= self.temperature <= 100:
            raise ConfigError(f"GenerateConfig.temperature must be a number from 0 (greedy) to 100, "
                              f"got {self.temperature!r}")
        for name in ("quality", "measure_memory"):
            check_bool("GenerateConfig", name, getattr(self, name))
        check_device("GenerateConfig", self.device)
        check_label("GenerateConfig", self.label)
        check_threads("GenerateConfig", self.threads)
        self._validate_lengths()
        self._validate_quality_tokens()

    def _checkpoint_folder(self) -> None:
        """A model given as a checkpoint folder's path: its family (scalekit.hf.checkpoint_folder), and its own
        tokenizer where none is given (refused, naming the folder, when text prompts need one it does not have)."""
        if not (isinstance(self.model, str) and self.model in MODEL_NAMES):
            self.model = checkpoint_model(self.model, "GenerateConfig.model")
        if not isinstance(self.model, HFCheckpoint) or self.tokenizer is not None:
            return
        texts = not isinstance(self.prompts, list) or any(isinstance(p, str) for p in self.prompts)
        if texts or not tokenizer_problem(self.model.folder):
            self.tokenizer = self.model.tokenizer("GenerateConfig.model")
            windows, seq = self.quality_windows, self.quality_seq_len or DEFAULT_QUALITY_SEQ_LEN
            if self.quality is True and self.quality_tokens is None and all(  # (bad values: refused by validate)
                    isinstance(n, int) and 0 < n <= 2**20 for n in (windows, seq)):
                # the held-out text in the model's own tokens: as many characters as the windows can read (a
                # token holds at most a few: 8 each is ample), not the whole split (0.7 s to tokenize)
                self.quality_tokens = list(self.tokenizer.encode(split_text("val")[:8 * (windows * seq + 1)]))

    def _validate_tokenizer(self) -> None:
        if self.tokenizer is not None and not (callable(getattr(self.tokenizer, "encode", None))
                                               and callable(getattr(self.tokenizer, "decode", None))):
            raise ConfigError("GenerateConfig.tokenizer must have encode(text) -> ids and decode(ids) -> text")

    def _validate_model(self) -> None:
        import_named_code(self, ("model",))  # "mypkg.models:make": what it names
        if isinstance(self.model, str):
            if self.model not in MODEL_NAMES:
                raise ConfigError(f"GenerateConfig.model: unknown model {self.model!r}; allowed: "
                                  f"{', '.join(MODEL_NAMES)}, a Hugging Face model or config, or your own nn.Module")
        elif not (isinstance(self.model, torch.nn.Module) or callable(self.model) or is_hf_source(self.model)):
            raise ConfigError(f"GenerateConfig.model must be a model name, an nn.Module, a Hugging Face config or a "
                              f"function returning a model, got {type(self.model).__name__}")
        if self.custom_model:
            family = self.family()
            for name, value in self.toggles.items():
                ok, why = TOGGLES[name].choice_applies(family, value)
                if not ok:
                    raise ToggleUnavailable(f"GenerateConfig.model: {toggle_why(name, why)}")

    def _validate_prompts(self) -> None:
        prompts = self.prompts
        if not isinstance(prompts, list) or not prompts or len(prompts) > MAX_PROMPTS:
            raise ConfigError(f"GenerateConfig.prompts must be a prompt (text) or a list of 1 to {MAX_PROMPTS} "
                              f"of them, got {self.prompts!r:.80}")
        for i, p in enumerate(prompts):
            ok = (isinstance(p, str) and p) or (isinstance(p, list) and p and all(
                isinstance(t, numbers.Integral) and not isinstance(t, bool) and t >= 0 for t in p))
            if not ok:
                raise ConfigError(f"GenerateConfig.prompts[{i}] must be non-empty text or a non-empty list of "
                                  f"token ids (integers >= 0), got {p!r:.80}")
        ids = self.prompt_ids()  # every character must be a token the tokenizer knows
        family = self.family()
        if len({len(p) for p in ids}) > 1 and not family.pads_prompts():
            raise ConfigError(f"GenerateConfig.prompts: prompts of different lengths are left-padded, and "
                              f"{family.family} cannot be told where each row starts (a forward with pad=..., as the "
                              f"built-in GPT's, or a Hugging Face model's attention_mask): give prompts of one length")
        vocab = self.vocab_size()
        for i, p in enumerate(ids):  # an id beyond the vocabulary would fail only inside the embedding
            if vocab is not None and max(p) >= vocab:
                came = " (from GenerateConfig.tokenizer)" if isinstance(self.prompts[i], str) else ""
                raise ConfigError(f"GenerateConfig.prompts[{i}] holds token id {max(p)}{came}, outside the model's "
                                  f"vocabulary of {vocab} ids (allowed: 0 to {vocab - 1})")

    def _validate_lengths(self) -> None:
        context = self.context_length()
        if context is None:
            return
        ids = self.prompt_ids()
        longest = max(len(p) for p in ids)
        for i, p in enumerate(ids):
            if len(p) >= context:  # the prompt is at fault, not max_new_tokens: no room for any new token
                raise ConfigError(f"GenerateConfig.prompts[{i}] is {len(p)} tokens, longer than the model's context "
                                  f"of {context} positions allows: a prompt may be at most {context - 1} tokens, "
                                  f"leaving room for one new token")
        if longest + self.max_new_tokens > context:
            model = f"GenerateConfig.model {self.model!r}" if isinstance(self.model, str) else "GenerateConfig.model"
            raise ConfigError(f"GenerateConfig.max_new_tokens: the longest of GenerateConfig.prompts ({longest} "
                              f"tokens) plus max_new_tokens ({self.max_new_tokens}) is "
                              f"{longest + self.max_new_tokens}, beyond the context of {model} ({context} positions): "
                              f"at most {context - longest} new tokens")
        if self.quality and self.quality_seq_len is not None and self.quality_seq_len > context:
            raise ConfigError(f"GenerateConfig.quality_seq_len ({self.quality_seq_len}) is beyond the model's "
                              f"context of {context} positions; allowed: 2 to {context} (None: cut to fit)")

    def _validate_quality_tokens(self) -> None:
        tokens = self.quality_tokens
        if tokens is None:
            return
        if isinstance(tokens, torch.Tensor):
            tokens = tokens.tolist() if tokens.dim() == 1 else None
        ok = isinstance(tokens, Sequence) and not isinstance(tokens, str) and all(
            isinstance(t, numbers.Integral) and not isinstance(t, bool) and t >= 0 for t in tokens)
        if not ok or len(tokens) < 3:
            raise ConfigError("GenerateConfig.quality_tokens must be a 1-D list or tensor of at least 3 token ids "
                              "(integers >= 0), or None for the shipped corpus")
        vocab = self.vocab_size()
        if vocab is not None and max(tokens) >= vocab:
            raise ConfigError(f"GenerateConfig.quality_tokens holds token id {max(tokens)}, outside the model's "
                              f"vocabulary of {vocab} ids (allowed: 0 to {vocab - 1})")

    # -- what the config says, concretely -----------------------------------------------------------
    @property
    def custom_model(self) -> bool:
        """A model other than the built-in GPT (a Hugging Face model, or your own)."""
        return not isinstance(self.model, str) and not _is_builtin_gpt(self.model)

    def family(self):
        """The model's generation family (scalekit.models.family.ModelAdapter): how it runs a decode step."""
        return generation_family(self.model)

    def context_length(self) -> int | None:
        """Positions the model holds (None for your own model when it does not say: its limits are its own)."""
        from ..models.pretrained import pretrained_info

        if isinstance(self.model, str):
            return pretrained_info(self.model)["config"]["block_size"] if self.model in PRETRAINED_NAMES \
                else PRESETS[self.model].block_size
        return self.family().context_len

    def vocab_size(self) -> int | None:
        """Token ids the model reads (None: your model does not say)."""
        from ..models.pretrained import pretrained_info

        if isinstance(self.model, str):
            return pretrained_info(self.model)["config"]["vocab_size"] if self.model in PRETRAINED_NAMES \
                else PRESETS[self.model].vocab_size
        return self.family().vocab_size

    def quality_window(self) -> int:
        """Tokens per held-out window: quality_seq_len, or 256 cut to the model's context."""
        if self.quality_seq_len is not None:
            return self.quality_seq_len
        context = self.context_length()
        return min(DEFAULT_QUALITY_SEQ_LEN, context - 1) if context else DEFAULT_QUALITY_SEQ_LEN

    def get_tokenizer(self):
        return self.tokenizer if self.tokenizer is not None else corpus_tokenizer()

    def prompt_ids(self) -> list[list[int]]:
        tok = self.get_tokenizer() if any(isinstance(p, str) for p in self.prompts) else None
        out = []
        for i, p in enumerate(self.prompts):
            out.append(self._encode(tok, i, p) if isinstance(p, str) else list(p))
        return out

    def _encode(self, tok, i: int, text: str) -> list[int]:
        """prompts[i] as token ids; a tokenizer that fails or returns something else is said in words."""
        mine = self.tokenizer is not None  # a user's tokenizer, or the shipped corpus' characters
        try:
            ids = list(tok.encode(text))
        except (KeyError, ValueError) as exc:
            if mine:
                raise ConfigError(f"GenerateConfig.tokenizer cannot encode prompts[{i}]: "
                                  f"{type(exc).__name__}: {exc}") from None
            raise ConfigError(f"GenerateConfig.prompts[{i}]: the tokenizer does not know {exc}; the shipped "
                              f"model reads the characters of Tiny Shakespeare") from None
        except Exception as exc:  # noqa: BLE001 - a user's tokenizer can raise anything
            raise ConfigError(f"GenerateConfig.tokenizer.encode failed on prompts[{i}]: "
                              f"{type(exc).__name__}: {exc}") from None
        if not ids or not all(isinstance(t, numbers.Integral) and not isinstance(t, bool) and t >= 0 for t in ids):
            raise ConfigError(f"GenerateConfig.tokenizer.encode must return a non-empty list of token ids "
                              f"(integers >= 0); for prompts[{i}] it returned {ids!r:.80}")
        return [int(t) for t in ids]

    def describe(self) -> str:
        if not self.toggles:
            return "baseline"
        return " + ".join(n if v is True or v == "default" else f"{n}={v}" for n, v in self.toggles.items())

    def resolve(self, hw=None) -> GenerateConfig:
        """A copy with the label made concrete."""
        return dataclasses.replace(self, toggles=dict(self.toggles), label=self.label or self.describe())

    def check_available(self, hw) -> None:
        """Raise ToggleUnavailable for the first toggle (or mode) this machine cannot run, with the reason."""
        for name, value in self.toggles.items():
            ok, why = TOGGLES[name].choice_available(hw, value)
            if not ok:
                raise ToggleUnavailable(f"GenerateConfig.toggles: toggle {name!r} is unavailable on this machine: {why}")

    def to_dict(self) -> dict:
        out = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name in ("model", "tokenizer") and value is not None and not isinstance(value, str):
                value = getattr(value, "__qualname__", type(value).__qualname__)
            elif f.name == "quality_tokens" and value is not None:
                value = f"{len(value)} token ids"
            out[f.name] = dict(value) if f.name == "toggles" else value
        return out


DEFAULT_QUALITY_SEQ_LEN = 256
DEFAULT_NEW_TOKENS = 200
INT_RANGES = {
    "max_new_tokens": (1, 10**6),
    "seed": (0, 2**63 - 1),
    "warmup_tokens": (0, 10**6),
    "quality_windows": (1, 10**5),
    "quality_seq_len": (2, 2**20),
}


@functools.lru_cache(maxsize=1)
def corpus_tokenizer():
    """The shipped corpus' character tokenizer (the shipped model's), made once."""
    return CharTokenizer(corpus_text())


def _is_builtin_gpt(model) -> bool:
    from ..models.gpt import GPT

    return isinstance(model, GPT)
