"""Training's evaluation: every N steps of a run, under the inference toggles, its cost counted apart.

`RunConfig(eval_every=N)` makes the engine call `Evaluator.maybe_run` between measured steps, outside their
timing but inside the run's wall time: each evaluation reads the held-out loss over the same fixed batches
(the validation split of the shipped corpus, as the model's family takes it; for your own model, batches
your batch_fn or dataset made once at the start) and, with `eval_new_tokens`, writes a short greedy sample with the decode loop.  Both run under the
grad mode and KV cache the generation toggles chose (inference_mode, kv_cache) and the run's autocast.
The result keeps every evaluation and the share of the wall time they took.  The training build makes the
evaluator (`build_evaluator`, its last BUILDERS step); generation's own code never imports it.
"""

from __future__ import annotations

import time
from itertools import islice

import numpy as np
import torch

from ..data import dataset_loader, load_tokens, synthetic_batches, to_device
from ..data.files import is_data_path
from ..data.loaders import FINETUNE_HELDOUT
from ..errors import ConfigError
from ..hf.tokenizer_of import tokenized_data
from ..inference.config import corpus_tokenizer
from ..inference.loop import decode, step_contexts
from ..models.presets import PRESETS
from ..toggles import PHASES, TOGGLES, BuildContext, apply_toggles

SAMPLE_PROMPT_TOKENS = 8  # the sample continues the first characters of the held-out text


def heldout_batches(cfg, device, family=None) -> list:
    """The evaluation's fixed batches: consecutive validation windows of the run's shape (as the model's
    family's loss takes them: a Hugging Face model's {"input_ids", "labels"}), or batches of your batch_fn or
    dataset, made once."""
    if cfg.batch_fn is not None:
        return [cfg.batch_fn(cfg.batch_size, device) for _ in range(cfg.eval_batches)]
    if cfg.dataset is not None:  # (a different shuffle of the same data: scalekit knows no held-out part of it)
        batches = iter(dataset_loader(cfg.dataset, cfg.batch_size, cfg.seed + 1, cfg.collate_fn))
        return [to_device(next(batches), device) for _ in range(cfg.eval_batches)]
    convert = family.batch_of if family is not None else (lambda x, y: (x, y))
    if cfg.data == "synthetic":
        vocab = family.vocab_size if family is not None else PRESETS[cfg.preset].vocab_size
        batches = synthetic_batches(vocab, cfg.seq_len, cfg.batch_size, cfg.seed + 1, device)
        return [convert(x, y) for x, y in islice(batches, cfg.eval_batches)]
    # the held-out part of what the run trains on: a data file's last 10%, a fine-tuning source's own held-out split
    # (its training text is part of the corpus's validation split), else the corpus's validation split
    tokens = np.asarray(tokenized_data(cfg).part("heldout")[0] if is_data_path(cfg.data) else
                        load_tokens(FINETUNE_HELDOUT.get(cfg.data, "val")))
    T, B = cfg.seq_len, cfg.batch_size
    fit = (len(tokens) - 1) // T
    if fit < B:
        raise ConfigError(f"RunConfig.eval_every: the held-out split holds {fit} windows of seq_len={T}, fewer than "
                          f"one batch of {B}")
    out = []
    for b in range(min(cfg.eval_batches, fit // B)):
        rows = [torch.from_numpy(tokens[(b * B + r) * T:(b * B + r) * T + T + 1].astype(np.int64)) for r in range(B)]
        xy = torch.stack(rows).to(device)
        out.append(convert(xy[:, :-1], xy[:, 1:]))
    return out


class Evaluator:
    """Held-out loss (and a short sample) every `eval_every` measured steps, timed apart from the steps."""

    def __init__(self, ctx: BuildContext):
        cfg = ctx.config
        self.ctx = ctx
        self.every, self.warmup = cfg.eval_every, cfg.warmup_steps
        self.batches = heldout_batches(cfg, ctx.device, ctx.model_adapter)
        self.prompt = None
        if cfg.eval_new_tokens:
            self.prompt = self._sample_prompt(ctx, cfg)

    @staticmethod
    def _sample_prompt(ctx: BuildContext, cfg) -> torch.Tensor:
        if (cfg.custom_model and ctx.model_adapter is None) or cfg.data != "shakespeare":
            raise ConfigError("RunConfig.eval_new_tokens: a sample during training is written on the shipped corpus "
                              "(data='shakespeare') by the built-in GPT or a Hugging Face model; set it to 0 for this run")
        if ctx.world_size > 1:
            raise ConfigError("RunConfig.eval_new_tokens: the sample is written in one process; with ranks, set it "
                              "to 0 (the held-out loss is still measured)")
        context = ctx.gpt_config.block_size if ctx.gpt_config is not None else ctx.model_adapter.context_len
        if context and SAMPLE_PROMPT_TOKENS + cfg.eval_new_tokens > context:
            raise ConfigError(f"RunConfig.eval_new_tokens must be at most {context - SAMPLE_PROMPT_TOKENS} for this "
                              f"model's context")
        ids = np.asarray(load_tokens("val")[:SAMPLE_PROMPT_TOKENS]).astype(np.int64)
        return torch.from_numpy(ids)[None].to(ctx.device)

    def maybe_run(self, step: int, result) -> None:
        """Evaluate after measured step `step` when it is an evaluation step; record it in `result`."""
        measured = step - self.warmup + 1
        if measured < 1 or measured % self.every:
            return
        t = time.perf_counter()
        record = {"step": step, "loss": self.loss()}
        if self.prompt is not None:
            record.update(self.sample())
        record["eval_ms"] = (time.perf_counter() - t) * 1e3
        result.evals.append(record)
        result.eval_s = (result.eval_s or 0.0) + record["eval_ms"] / 1e3

    def loss(self) -> float:
        ctx = self.ctx
        model = ctx.model
        was_training = model.training
        model.eval()
        try:
            with step_contexts(ctx):
                losses = [ctx.loss_fn(model, batch).detach().float() for batch in self.batches]
            return torch.stack(losses).mean().item()
        finally:
            model.train(was_training)

    def sample(self) -> dict:
        """A short greedy continuation of the held-out text's first characters, with the decode loop."""
        ctx = self.ctx
        n = ctx.config.eval_new_tokens
        model = ctx.base_model
        was_training = model.training
        model.eval()
        try:
            done = decode(ctx, self.prompt, None, n, self.prompt.shape[1] + n, model=model)
        finally:
            model.train(was_training)
        text = corpus_tokenizer().decode(done.tokens[0].tolist())
        steps = len(done.step_ms)
        return {"text": text, "sample_tokens_per_s": steps / (sum(done.step_ms) / 1e3) if steps else None}


def build_evaluator(ctx: BuildContext) -> None:
    """After the training build: the evaluation's own toggles (those that apply to generation only, such as
    inference_mode and kv_cache) walked through the same phases with loop="generate", then the evaluator."""
    cfg = ctx.config
    if not cfg.eval_every:
        return
    if cfg.eval_every > cfg.steps:  # a note, not a refusal: autotune and ladders shorten a run's steps
        acting = [n for n in cfg.toggles if "train" not in TOGGLES[n].loops]
        ctx.notes.append(f"eval_every={cfg.eval_every} is more than steps={cfg.steps}: no evaluation runs"
                         + (f", so {', '.join(acting)} act on nothing" if acting else ""))
        return
    only_generate = {n: v for n, v in cfg.toggles.items() if "train" not in TOGGLES[n].loops}
    for phase in PHASES:
        apply_toggles(ctx, phase, only_generate, loop="generate")
    ctx.evaluator = Evaluator(ctx)
