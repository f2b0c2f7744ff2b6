"""Building a training run and taking one step: the part of the loop every measurement shares.

`build` makes everything a run needs, fresh, phase by phase (`scalekit.toggles.PHASES`): after each
phase's toggles the build makes what that phase is for (BUILDERS): the batches, the model, the optimizer
and its stepper.  `train_step` is one optimizer step, read top to bottom: micro-batches, autocast,
backward through the stepper, the update.  The planner runs these same functions on fake tensors.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import itertools
from collections.abc import Callable, Iterator, Mapping

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten
from torch.utils.data import IterableDataset

from ..data import (
    CountedBatches,
    LoaderBatches,
    MappedBatches,
    dataset_loader,
    first_batch,
    raw_loader,
    shakespeare_loader,
    synthetic_batches,
    to_device,
)
from ..data.files import is_data_path
from ..data.loaders import token_loader
from ..data.packing import PackedDocuments, real_tokens
from ..distributed import runtime, sharding
from ..errors import ConfigError
from ..hf.family_of import model_adapter
from ..hf.tokenizer_of import tokenized_data
from ..machine import hardware
from ..measure import flops as flops_mod
from ..measure import memory
from ..models import GPT, PRESETS
from ..models.blocks import find_blocks
from ..models.pretrained import load_pretrained
from ..toggles import PHASES, BuildContext, OptimizerStep, apply_toggles, mesh_dims, needs_process_group
from .config import RunConfig
from .evaluation import build_evaluator


def gpt_loss(model: torch.nn.Module, batch) -> torch.Tensor:
    x, y = batch
    return model(x, y)[1]


def build(cfg: RunConfig, hw: hardware.Hardware, stack: contextlib.ExitStack) -> BuildContext:
    """Everything a run needs, built fresh, phase by phase (PHASES): after each phase's toggles, what that
    phase is for is built (BUILDERS): the batches, the model, the optimizer and its stepper.  A toggle or mode
    this machine cannot run is refused first, whoever builds (scalekit.run checks it before it plans, too)."""
    cfg.check_available(hw)
    torch.manual_seed(cfg.seed)
    adapter = model_adapter(cfg.model)
    ctx = BuildContext(config=cfg, hw=hw, device=hw.device, stack=stack,
                       world_size=runtime.world_size() if needs_process_group(cfg.toggles) else 1,
                       gpt_config=None if cfg.custom_model else PRESETS[cfg.preset].gpt_config(cfg.seq_len),
                       model_adapter=None if adapter is None else adapter.copy())  # the toggles change the copy
    dims = mesh_dims(cfg.toggles)
    if dims:  # one mesh for every parallel toggle, its shape checked against the ranks before anything is built
        ctx.mesh = sharding.device_mesh(ctx.device.type, sharding.mesh_shape(dims, ctx.world_size))
        ctx.data_parallel = sharding.batch_split(ctx.mesh)
    for phase in PHASES:
        apply_toggles(ctx, phase, cfg.toggles)
        if phase in BUILDERS:
            BUILDERS[phase](ctx)
    return ctx


def build_batches(ctx: BuildContext) -> None:
    cfg = ctx.config
    ctx.batch_counter = batches = CountedBatches(make_batches(ctx))
    ctx.stack.callback(batches.close)  # a DataLoader's worker processes end with the run, however it ends
    for wrap in ctx.batch_wrappers:  # e.g. data_echo: each fetched batch used for several steps
        batches = wrap(batches)
    # in a run spread over ranks, each rank keeps its own slice of every global batch
    # (the ranks of a tensor-parallel group and of a pipeline share their batch: ctx.data_parallel, read at the first batch)
    ctx.batches = runtime.shard_batches(batches, cfg.batch_size, lambda: ctx.data_parallel) \
        if ctx.world_size > 1 else batches


def build_model(ctx: BuildContext) -> None:
    cfg = ctx.config
    if ctx.model_adapter is not None:  # a model family's own build (Hugging Face: the toggles' switches set)
        model = ctx.model_adapter.build()
        ctx.loss_fn = scalar_checked(cfg.loss_fn) if cfg.loss_fn is not None else ctx.model_adapter.loss
    elif cfg.custom_model:
        model = cfg.model() if not isinstance(cfg.model, torch.nn.Module) else copy.deepcopy(cfg.model)
        ctx.loss_fn = scalar_checked(cfg.loss_fn)
    else:
        model = GPT(ctx.gpt_config)
        if cfg.init == "pretrained":
            load_pretrained_weights(model, PRESETS[cfg.preset].pretrained)
        ctx.loss_fn = gpt_loss
    if any(t.device != ctx.device for t in itertools.chain(model.parameters(), model.buffers())):
        model = model.to(ctx.device)  # (only when needed: the planner's fake tensors cannot be moved in place)
    ctx.base_model = model  # unwrapped: for FLOPs, memory and checkpoints
    ctx.model = ctx.base_model
    ctx.blocks = find_blocks(ctx.base_model)


def build_optimizer(ctx: BuildContext) -> None:
    # only what trains: frozen weights (fine-tuning) get no gradient, so no optimizer state either
    params = [p for p in ctx.model.parameters() if p.requires_grad]
    if not params:
        raise ConfigError("nothing to train: every parameter of the model is frozen (requires_grad=False)")
    def make(params: list) -> torch.optim.Optimizer:
        if ctx.optimizer_factory is not None:
            return ctx.optimizer_factory(params)
        return torch.optim.AdamW(params, lr=ctx.config.lr, **ctx.optimizer_kwargs)

    # ZeRO-1: the same optimizer, each rank stepping only its share of the weights
    ctx.optimizer = sharding.zero_redundancy(params, make) if ctx.optimizer_state_sharded else make(params)
    ctx.stepper = OptimizerStep(ctx.optimizer, ctx.grad_scaler)


# What the engine builds after the toggles of a phase (phases without an entry build nothing themselves);
# after the last, the evaluation a run with eval_every makes between its steps.
BUILDERS = {"data": build_batches, "model_config": build_model, "optimizer": build_optimizer,
            "step": build_evaluator}


def load_pretrained_weights(model: torch.nn.Module, name: str) -> None:
    """The shipped weights `name` into a freshly built GPT of the same shape (RunConfig(init="pretrained"))."""
    state = load_pretrained(name).state_dict()
    mine = model.state_dict()
    wrong = [k for k in state if k not in mine or mine[k].shape != state[k].shape]
    if wrong:
        raise ConfigError(f"RunConfig.init='pretrained': the model built does not have the shipped model's shape "
                          f"(first mismatch: {wrong[0]}); a toggle that changes the architecture's sizes "
                          f"(nice_numbers pads the vocabulary) cannot start from these weights")
    model.load_state_dict(state)


def scalar_checked(loss_fn: Callable) -> Callable:
    """Your loss_fn, its value refused in words unless it is a one-element tensor (what backward() needs)."""
    @functools.wraps(loss_fn)
    def checked(model, batch):
        loss = loss_fn(model, batch)
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            got = f"a tensor of shape {tuple(loss.shape)}" if isinstance(loss, torch.Tensor) else type(loss).__name__
            raise ConfigError(f"RunConfig.loss_fn must return a scalar tensor, got {got}")
        return loss
    return checked


def make_batches(ctx: BuildContext) -> Iterator:
    """The run's input pipeline, as the data toggles set it up (their BuildContext fields)."""
    cfg, device = ctx.config, ctx.device
    if cfg.batch_fn is not None:
        return (cfg.batch_fn(cfg.batch_size, device) for _ in iter(int, 1))
    if cfg.dataset is not None:  # your Dataset, through the DataLoader the data toggles configure
        if isinstance(cfg.dataset, IterableDataset) and ctx.loader_kwargs.get("num_workers"):
            ctx.notes.append("an iterable dataset with workers: each worker runs the whole iterator unless the "
                             "dataset splits itself by torch.utils.data.get_worker_info()")
        dataset, collate_fn = run_dataset(ctx)
        loader = dataset_loader(dataset, cfg.batch_size, cfg.seed, collate_fn, **ctx.loader_kwargs)
        return LoaderBatches(loader, device, non_blocking=ctx.non_blocking_copy)
    if is_data_path(cfg.data):  # your data file, tokenized with the model's tokenizer (cached)
        loader, convert = file_loader(ctx, ctx.loader_kwargs)
        batches = LoaderBatches(loader, device, non_blocking=ctx.non_blocking_copy)
        return batches if convert is None else MappedBatches(batches, convert)
    adapter = ctx.model_adapter
    if adapter is not None and cfg.data == "synthetic":  # a model family's own random tokens (its vocabulary)
        return adapter.batches(cfg, device, ctx.loader_kwargs)
    if cfg.data == "synthetic":
        vocab = PRESETS[cfg.preset].vocab_size
        return synthetic_batches(vocab, cfg.seq_len, cfg.batch_size, cfg.seed, device)
    if cfg.data == "shakespeare-raw":
        loader = raw_loader(cfg.seq_len, cfg.batch_size, cfg.seed, cfg.transform_rounds,
                            pretokenized=ctx.read_training_format, batch_transforms=ctx.batch_transforms,
                            **ctx.loader_kwargs)
    else:
        split = "new-plays" if cfg.data == "new-plays" else "train"
        loader = shakespeare_loader(cfg.seq_len, cfg.batch_size, cfg.seed, split=split, **ctx.loader_kwargs)
    batches = LoaderBatches(loader, device, non_blocking=ctx.non_blocking_copy)
    # the same corpus pipeline for a model family, in the batches its loss takes (Hugging Face: input_ids/labels)
    return batches if adapter is None else MappedBatches(batches, lambda xy: adapter.batch_of(*xy))


def file_loader(ctx: BuildContext, loader_kwargs: dict) -> tuple:
    """(the DataLoader over the training part of the run's data file, what turns its batches into the model
    family's, or None): windows of its tokens end to end, or with sequence_packing its documents packed into rows."""
    cfg, adapter = ctx.config, ctx.model_adapter
    tokenized = tokenized_data(cfg)
    vocab = ctx.gpt_config.vocab_size if ctx.gpt_config is not None else getattr(adapter, "vocab_size", None)
    if vocab is not None and tokenized.meta["vocab_size"] > vocab:
        raise ConfigError(f"RunConfig.data={cfg.data!r}: its tokenizer has {tokenized.meta['vocab_size']:,} ids, "
                          f"more than the model's vocabulary of {vocab:,}: give the model its own tokenizer's folder")
    ctx.notes.extend(n for n in tokenized.notes() if n not in ctx.notes)
    if ctx.pack_sequences:
        packed = PackedDocuments(tokenized.documents("train"), cfg.seq_len, cfg.seed, cfg.batch_size)
        return dataset_loader(packed, cfg.batch_size, cfg.seed, **loader_kwargs), None
    tokens = tokenized.part("train")[0]
    if len(tokens) < cfg.seq_len + 1:
        raise ConfigError(f"RunConfig.data={cfg.data!r}: its training part (the first 90% of its tokens) holds "
                          f"{len(tokens):,} tokens, fewer than one window of seq_len+1={cfg.seq_len + 1}: give more "
                          f"text or a shorter seq_len")
    loader = token_loader(tokens, cfg.seq_len, cfg.batch_size, cfg.seed, **loader_kwargs)
    return loader, None if adapter is None else (lambda xy: adapter.batch_of(*xy))


def run_dataset(ctx: BuildContext) -> tuple:
    """(the dataset the DataLoader reads, its collate_fn): the user's, or its documents packed into full rows."""
    cfg = ctx.config
    if ctx.pack_sequences:
        return PackedDocuments(cfg.dataset, cfg.seq_len, cfg.seed, cfg.batch_size), None
    return cfg.dataset, cfg.collate_fn


def split_batch(batch, parts: int) -> list:
    """Split every tensor in `batch` into `parts` equal micro-batches along dim 0."""
    if parts == 1:
        return [batch]
    leaves, spec = tree_flatten(batch)
    chunks = [leaf.chunk(parts) if isinstance(leaf, torch.Tensor) else [leaf] * parts for leaf in leaves]
    return [tree_unflatten([c[k] for c in chunks], spec) for k in range(parts)]


def train_step(ctx: BuildContext, batch) -> torch.Tensor:
    """One optimizer step: forward and backward per micro-batch under the step contexts, update, clear grads."""
    micro_batches = split_batch(batch, ctx.grad_accum_steps)
    losses = []
    for k, micro in enumerate(micro_batches):
        last = k == len(micro_batches) - 1
        # gradients are averaged over micro-batches: the same as one step on the whole batch
        sync = contextlib.nullcontext() if last or ctx.no_sync is None else ctx.no_sync()
        autocast = (torch.autocast(ctx.device.type, dtype=ctx.compute_dtype) if ctx.compute_dtype
                    else contextlib.nullcontext())
        with sync:
            with autocast:
                loss = ctx.loss_fn(ctx.model, micro) / len(micro_batches)
            ctx.stepper.backward(loss, boundary=last)
        losses.append(loss.detach())
    ctx.stepper.step()  # the update, and the gradients cleared (set to None)
    return losses[0] if len(losses) == 1 else torch.stack(losses).sum()


def tokens_per_step(cfg: RunConfig) -> int:
    if cfg.custom_model:
        return cfg.batch_size * cfg.tokens_per_sample
    return cfg.batch_size * cfg.seq_len


def flops_per_step(ctx: BuildContext) -> float | None:
    cfg = ctx.config
    if not cfg.custom_model:
        g = ctx.gpt_config
        per_token = flops_mod.gpt_train_flops_per_token(ctx.base_model.num_params(), g.n_layer, g.n_embd, cfg.seq_len)
        return per_token * tokens_per_step(cfg)
    # a user's model: count one forward/backward of the unwrapped model, leaving RNG and gradients as they were.
    # Eagerly: blocks compiled in place (compile='regional') are inside base_model, and dynamo running under the
    # counter's dispatch mode would mark their code "skip" for the rest of the process (no graph, ever)
    eager = torch.compiler.set_stance("force_eager") if ctx.compiled else contextlib.nullcontext()
    with torch.random.fork_rng(devices=[ctx.device] if ctx.device.type == "cuda" else []), eager:
        batch = sample_batch(cfg, ctx)
        batch_rows(cfg, batch)  # a batch with no tensor is blamed on what made it, before loss_fn reads it
        trained = [p for p in ctx.base_model.parameters() if p.requires_grad]
        counted = flops_mod.counted_train_flops(lambda: ctx.loss_fn(ctx.base_model, batch), trained)
    ctx.base_model.zero_grad(set_to_none=True)  # what a reentrant-checkpointing model's count left there
    return counted or None


def sample_batch(cfg: RunConfig, ctx: BuildContext):
    """One batch of a user's model, made in this process outside the run's pipeline (for counting FLOPs)."""
    if cfg.batch_fn is not None:
        return cfg.batch_fn(cfg.batch_size, ctx.device)
    if cfg.dataset is not None:
        dataset, collate_fn = run_dataset(ctx)
        return to_device(first_batch(dataset, cfg.batch_size, cfg.seed, collate_fn), ctx.device)
    if is_data_path(cfg.data):
        loader, convert = file_loader(ctx, {})
        batch = to_device(next(iter(loader)), ctx.device)
        return batch if convert is None else convert(batch)
    return next(ctx.model_adapter.batches(cfg, ctx.device, {}))


def batch_maker(cfg: RunConfig) -> str:
    """Whose code made a run's batches, as the error about a batch names it."""
    if cfg.batch_fn is not None:
        return "RunConfig.batch_fn"
    if cfg.dataset is not None:
        return "RunConfig.collate_fn" if cfg.collate_fn is not None else "torch's default collate of RunConfig.dataset"
    return "the run's data"


def batch_rows(cfg: RunConfig, batch) -> int:
    """Rows of `batch`: the first dimension of its first tensor; refuses a batch that holds no tensor."""
    leaves = [leaf for leaf in tree_flatten(batch)[0] if isinstance(leaf, torch.Tensor) and leaf.dim() > 0]
    if not leaves:
        raise ConfigError(f"{batch_maker(cfg)} returned a batch with no tensor in it "
                          f"({type(batch).__name__}): return a tensor, or a tuple/dict of tensors whose first "
                          f"dimension is the batch")
    return leaves[0].shape[0]


def batch_tokens(ctx: BuildContext, batch) -> int:
    """Tokens in this rank's `batch` (rows × tokens per row); refuses a batch the step cannot split."""
    cfg = ctx.config
    rows = batch_rows(cfg, batch)
    ids = batch.get("input_ids") if isinstance(batch, Mapping) else None
    k = ctx.grad_accum_steps
    if rows % k:
        raise ConfigError(f"a batch of {rows} rows cannot be split into grad_accum={k} equal micro-batches: "
                          f"{batch_maker(cfg) + ' must return batch_size rows' if cfg.custom_model else 'the batch'} "
                          f"(a multiple of {k})")
    if ctx.pack_sequences:
        return real_tokens(batch)  # padding is not work done
    mask = batch.get("attention_mask") if isinstance(batch, Mapping) else None
    if isinstance(ids, torch.Tensor) and ids.dim() == 2:
        if isinstance(mask, torch.Tensor) and mask.shape == ids.shape:
            return int(mask.sum())  # a padded batch: its real tokens (padding is not work done)
        return ids.numel()  # tokenized text: rows × its length, whatever the dataset's windows are
    return rows * (cfg.tokens_per_sample if cfg.custom_model else cfg.seq_len)


def step_tracker(ctx: BuildContext, tracker_cls=memory.LiveTensorBytes, devices=("cpu",)):
    """A live-tensor counter that starts from the run's weights, buffers and optimizer state."""
    baseline = [*ctx.base_model.parameters(), *ctx.base_model.buffers(),
                *memory.optimizer_state_tensors(ctx.optimizer)]
    return tracker_cls(baseline, devices=devices)


def probe_step_memory(ctx: BuildContext, tracker) -> int:
    """The most live tensor bytes during one more step of `ctx`, counted by `tracker` (step_tracker); the
    planner runs this same count over fake tensors."""
    # a dispatch mode cannot see inside compiled kernels, and dynamo would mark the model's code as
    # "skip" for the rest of the process: probe the eager model instead
    model, ctx.model = ctx.model, (ctx.base_model if ctx.compiled else ctx.model)
    eager = torch.compiler.set_stance("force_eager") if ctx.compiled else contextlib.nullcontext()  # compiled blocks
    try:
        with tracker, eager:
            train_step(ctx, next(ctx.batches))
    finally:
        ctx.model = model
    return tracker.peak_bytes
