"""Small models, configs, data and scripted results the tests share."""

from __future__ import annotations

import contextlib
import importlib.util
import itertools
import os
import shutil
import subprocess
from pathlib import Path

import torch
from torch.utils.data import Dataset

from scalekit import RunConfig, build, detect
from scalekit.inference import GenerateConfig, generate
from scalekit.training.build import train_step

CPU = detect("cpu")
COPY_TOGGLES = ("dataloader_pin_memory", "non_blocking")  # the host-to-device copy toggles (tests/toggles)


def tiny(**kwargs) -> RunConfig:
    """The tiny GPT on Shakespeare, few steps, on the CPU."""
    base = dict(preset="tiny", steps=6, warmup_steps=1, log_every=2, device="cpu")
    base.update(kwargs)
    return RunConfig(**base)


@contextlib.contextmanager
def built(cfg: RunConfig, hw=CPU):
    """A run's BuildContext (model, optimizer, step contexts), built as `run` would build it, without running."""
    cfg = cfg.resolve(hw)
    with contextlib.ExitStack() as stack:
        yield build(cfg, hw, stack)


def grads_of_one_step(cfg, batch=None) -> dict[str, torch.Tensor]:
    """The gradients the optimizer sees in one train_step of `cfg` (read from a step pre-hook)."""
    seen = {}
    with built(cfg) as ctx:
        names = {p: n for n, p in ctx.base_model.named_parameters()}

        def read(optimizer, args, kwargs):
            seen.update({names[p]: p.grad.clone() for g in optimizer.param_groups for p in g["params"]})

        ctx.optimizer.register_step_pre_hook(read)
        train_step(ctx, batch if batch is not None else next(ctx.batches))
        assert all(p.grad is None for p in ctx.base_model.parameters())  # zero_grad(set_to_none=True)
    return seen


def assert_same_grads(a: dict, b: dict, atol: float) -> None:
    assert a.keys() == b.keys() and a
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=atol, msg=lambda m, n=name: f"{n}: {m}")


# -- batches of the raw data source (tests/data/test_data_pipeline.py, the data toggles' files) --------------
# long windows and large batches: an epoch is a few batches, so the batches compared cross epoch edges and
# the raw text's block edges (every 65,536 characters), at a transform cost of one round
SHAPES = dict(seq_len=4096, batch_size=100, data="shakespeare-raw", transform_rounds=1)
N_BATCHES = 6  # 600 windows: the train split holds 245 of 4096 characters


def batches(cfg: RunConfig, n: int = N_BATCHES) -> list[tuple[torch.Tensor, torch.Tensor]]:
    with built(cfg) as ctx:
        return list(itertools.islice(ctx.batches, n))


def assert_same(a, b) -> None:
    assert len(a) == len(b)
    for k, ((xa, ya), (xb, yb)) in enumerate(zip(a, b, strict=True)):
        assert torch.equal(xa, xb) and torch.equal(ya, yb), f"batch {k} differs"


LIBRARY_WORDS = ("Failed to load", "Warning", "warn(", "[transformers]", "UserWarning", "W1", "loss_type")


def library_lines(stdout: str, stderr: str) -> list[str]:
    """What a `scalekit` command printed that is not scalekit's: stderr lines other than its progress ("  · ")
    and its own messages, and stdout lines holding the marks of a library's warnings."""
    foreign = [line for line in stderr.splitlines() if line and not line.startswith(("  · ", "scalekit"))]
    return foreign + [line for line in stdout.splitlines() if any(word in line for word in LIBRARY_WORDS)]


def learns(result, drop: float = 0.3) -> bool:
    """The loss is finite everywhere and fell by at least `drop` nats from the first step to the last."""
    losses = [loss for _, loss in result.losses]
    finite = all(torch.isfinite(torch.tensor(losses)))
    return bool(finite and losses[-1] < losses[0] - drop)


class Regressor(torch.nn.Module):
    """Not a GPT: a two-layer MLP fitting y = sum(x)."""

    def __init__(self, width: int = 32):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(16, width), torch.nn.ReLU(), torch.nn.Linear(width, 1))

    def forward(self, x):
        return self.net(x).squeeze(-1)


def regression_batch(batch_size: int, device: torch.device):
    x = torch.randn(batch_size, 16, device=device)
    return x, x.sum(-1)


def mse_loss(model, batch):
    x, y = batch
    return torch.nn.functional.mse_loss(model(x), y)


class _Attention(torch.nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.q, self.k, self.v, self.o = (torch.nn.Linear(d, d) for _ in range(4))
        self.heads = heads
        self.drop = torch.nn.Dropout(0.1)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = (lin(x).view(B, T, self.heads, C // self.heads).transpose(1, 2) for lin in (self.q, self.k, self.v))
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.drop(self.o(y.transpose(1, 2).reshape(B, T, C)))


class _NanoBlock(torch.nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.ln_1, self.ln_2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.attn = _Attention(d, heads)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.GELU(), torch.nn.Linear(4 * d, d),
                                       torch.nn.Dropout(0.1))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class NanoStyleGPT(torch.nn.Module):
    """A user's GPT in nanoGPT's layout (transformer.wte/wpe/drop/h/ln_f, tied lm_head; q, k, v apart, dropout)."""

    def __init__(self, vocab: int = 65, d: int = 128, heads: int = 4, layers: int = 4, block: int = 64):
        super().__init__()
        self.transformer = torch.nn.ModuleDict(dict(
            wte=torch.nn.Embedding(vocab, d), wpe=torch.nn.Embedding(block, d), drop=torch.nn.Dropout(0.1),
            h=torch.nn.ModuleList([_NanoBlock(d, heads) for _ in range(layers)]), ln_f=torch.nn.LayerNorm(d)))
        self.lm_head = torch.nn.Linear(d, vocab, bias=False)
        self.transformer.wte.weight = self.lm_head.weight

    def forward(self, idx, targets):
        t = self.transformer
        x = t.drop(t.wte(idx) + t.wpe(torch.arange(idx.shape[1], device=idx.device)))
        for block in t.h:
            x = block(x)
        logits = self.lm_head(t.ln_f(x))
        return logits, torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))


def token_batch(batch_size: int, device: torch.device):
    xy = torch.randint(0, 65, (batch_size, 65), device=device)
    return xy[:, :-1], xy[:, 1:]


def nano_loss(model, batch):
    return model(*batch)[1]


class ConvNet(torch.nn.Module):
    """Not a transformer: a stem, conv blocks (conv, batch norm, GELU) in an nn.Sequential, a linear head."""

    def __init__(self, width: int = 32, blocks: int = 4):
        super().__init__()
        self.stem = torch.nn.Conv2d(3, width, 3, padding=1)
        self.stages = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Conv2d(width, width, 3, padding=1),
                                                                torch.nn.BatchNorm2d(width), torch.nn.GELU())
                                            for _ in range(blocks)])
        self.head = torch.nn.Linear(width, 10)

    def forward(self, x):
        return self.head(self.stages(self.stem(x)).mean((2, 3)))


def image_batch(batch_size: int, device: torch.device):
    return torch.randn(batch_size, 3, 32, 32, device=device), torch.randint(0, 10, (batch_size,), device=device)


def classify_loss(model, batch):
    x, y = batch
    return torch.nn.functional.cross_entropy(model(x), y)


@contextlib.contextmanager
def one_thread():
    """torch on one intra-op thread, then as it was: a tiny model's decode steps are many small ops, which a
    second thread on a busy 2-core machine only slows down (the generation tests are about tokens, not speed)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


# -- greedy tokens from the shipped model (tests/toggles/test_kv_cache.py, test_inference_mode.py) -----------
PROMPT = "ROMEO:"
QUICK = dict(measure_memory=False, quality=False, warmup_tokens=0, device="cpu")  # the tokens, nothing measured


def greedy(toggles=None, n=60, **kw):
    return generate(GenerateConfig(prompts=kw.pop("prompts", PROMPT), max_new_tokens=n, toggles=toggles or {},
                                   **{**QUICK, **kw}), hw=CPU)


def small_plan(toggles=None, batch_size: int = 16, world_size: int | None = None):
    """scalekit.estimate of the small GPT on a GPU (planned, not run: any machine plans it), per rank of
    `world_size` ranks: the distributed toggles' memory claims, checked in one process."""
    from scalekit import estimate

    return estimate(RunConfig(preset="small", batch_size=batch_size, toggles=toggles or {}), device="cuda",
                    world_size=world_size)


def load_tool(name: str):
    """The script tools/<name>.py as a module (the tools are scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parents[1] / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@contextlib.contextmanager
def small_mount(folder: Path, size: str = "256k", read_only: bool = False):
    """A tmpfs of `size` mounted on `folder` (a full disk for what needs more), or read-only: what chmod cannot
    show a root user.  Skips, with the reason, where mounting is not allowed (not root, a container without
    CAP_SYS_ADMIN)."""
    import pytest

    folder.mkdir(parents=True, exist_ok=True)
    if shutil.which("mount") is None:
        pytest.skip("cannot mount a small tmpfs here: no mount command")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {(mounted.stderr or mounted.stdout).strip()}")
    try:
        if read_only:
            subprocess.run(["mount", "-o", "remount,ro", str(folder)], check=True, capture_output=True)
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False, capture_output=True)


def losses_over_ranks(ctx, steps: int, group) -> list[float]:
    """`steps` training steps of a built run; each step's loss averaged over the ranks of `group` (None: one
    process), as one process with the whole batch would report it."""
    import torch.distributed as dist

    from scalekit.training.build import train_step

    losses = []
    for _ in range(steps):
        loss = train_step(ctx, next(ctx.batches)).detach()
        if group is not None:
            dist.all_reduce(loss)
            loss /= group.world_size
        losses.append(loss.item())
    return losses


def scripted_result(label: str, step_ms: list[float], busy: bool):
    """A finished training run with these measured steps, measured on a machine the load meter saw busy or not."""
    from scalekit.measure.load import MachineLoad
    from scalekit.measure.timing import Spread
    from scalekit.training.results import RunResult, StepRecord

    steps = [StepRecord(step=i, warmup=False, step_ms=ms, tokens_per_s=512 / ms * 1e3, loss=None, mem_bytes=None,
                        tokens=512) for i, ms in enumerate(step_ms)]
    return RunResult(label=label, config={}, device="cpu", steps=steps, step_ms=Spread.of(step_ms),
                     tokens_per_step=512, tokens_per_s=512 / Spread.of(step_ms).median * 1e3, threads=1,
                     load=MachineLoad(1.5 if busy else 0.1, 2, 3.0))


def scripted_generation(label: str, token_ms: list[float], busy: bool):
    from scalekit.inference import GenerateResult
    from scalekit.measure.load import MachineLoad
    from scalekit.measure.timing import Spread

    return GenerateResult(label=label, config={}, device="cpu", batch_size=1, prompt_tokens=[6], new_tokens=12,
                          token_ms=token_ms, decode_ms=Spread.of(token_ms), ttft_ms=1.0, threads=1,
                          decode_tokens_per_s=1e3 / Spread.of(token_ms).median,
                          load=MachineLoad(1.5 if busy else 0.1, 2, 3.0))


REPO = Path(__file__).resolve().parents[1]  # the checkout


def scalekit_env(**extra) -> dict:
    """The environment for a `python -m scalekit.cli.main` child: this checkout first on the path."""
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    return dict(os.environ, PYTHONPATH=path, HF_HUB_OFFLINE="1", **extra)


class NoisyWindows(Dataset):
    """Windows of a token stream, each given a per-sample transform in Python (a seeded shift of some ids)."""

    def __init__(self, n: int = 40, seq_len: int = 16, vocab: int = 65, as_dict: bool = False):
        self.tokens = torch.arange(n * seq_len + 1) % vocab
        self.n, self.seq_len, self.vocab, self.as_dict = n, seq_len, vocab, as_dict

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        window = self.tokens[i * self.seq_len: (i + 1) * self.seq_len + 1].clone()
        g = torch.Generator().manual_seed(i)  # the transform depends on the sample, not on the process
        flip = torch.rand(window.shape, generator=g) < 0.1
        window[flip] = (window[flip] + 7) % self.vocab
        if self.as_dict:
            return {"input_ids": window[:-1]}
        return window[:-1], window[1:]


class TinyLM(torch.nn.Module):
    def __init__(self, vocab: int = 65, d: int = 16):
        super().__init__()
        self.emb, self.out = torch.nn.Embedding(vocab, d), torch.nn.Linear(d, vocab)

    def forward(self, idx):
        return self.out(self.emb(idx))


def lm_loss(model, batch):
    x, y = batch
    return torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())


class FastBlock(torch.nn.Module):
    """An attention block written the gpt-fast way: its cache lives in it, written at input_pos."""

    def __init__(self, d: int, heads: int):
        super().__init__()
        self.wqkv, self.wo = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.GELU(), torch.nn.Linear(4 * d, d))
        self.norm1, self.norm2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.heads = heads
        self.register_buffer("k_cache", None, persistent=False)  # allocated by setup_caches
        self.register_buffer("v_cache", None, persistent=False)

    def forward(self, x, input_pos, mask):
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.heads, -1).transpose(1, 2) for t in self.wqkv(self.norm1(x)).split(C, dim=2))
        self.k_cache[:B, :, input_pos] = k  # the cache is written in place, at the positions given
        self.v_cache[:B, :, input_pos] = v
        y = torch.nn.functional.scaled_dot_product_attention(q, self.k_cache[:B], self.v_cache[:B], attn_mask=mask)
        x = x + self.wo(y.transpose(1, 2).reshape(B, T, C))
        return x + self.mlp(self.norm2(x))


class FastLM(torch.nn.Module):
    """gpt-fast's convention: setup_caches(max_batch_size, max_seq_length), then forward(idx, input_pos)."""

    def __init__(self, vocab: int = 65, d: int = 32, heads: int = 2, layers: int = 2, block: int = 64):
        super().__init__()
        self.tok, self.pos = torch.nn.Embedding(vocab, d), torch.nn.Embedding(block, d)
        self.layers = torch.nn.ModuleList([FastBlock(d, heads) for _ in range(layers)])
        self.norm, self.output = torch.nn.LayerNorm(d), torch.nn.Linear(d, vocab)
        self.heads, self.max_batch_size, self.max_seq_length = heads, -1, -1

    def setup_caches(self, max_batch_size: int, max_seq_length: int) -> None:
        if self.max_seq_length >= max_seq_length and self.max_batch_size >= max_batch_size:
            return
        self.max_batch_size, self.max_seq_length = max_batch_size, max_seq_length
        d = self.tok.weight.shape[1]
        for layer in self.layers:
            shape = (max_batch_size, self.heads, max_seq_length, d // self.heads)
            layer.register_buffer("k_cache", torch.zeros(shape), persistent=False)
            layer.register_buffer("v_cache", torch.zeros(shape), persistent=False)
        mask = torch.tril(torch.ones(max_seq_length, max_seq_length, dtype=torch.bool))
        self.register_buffer("causal_mask", mask, persistent=False)

    def forward(self, idx, input_pos):
        assert self.max_seq_length > 0, "Caches must be initialized first"
        mask = self.causal_mask[None, None, input_pos]  # (1, 1, T, L): unwritten slots are in the future
        x = self.tok(idx) + self.pos(input_pos)
        for layer in self.layers:
            x = layer(x, input_pos, mask)
        return self.output(self.norm(x))


class ScriptedGeneration:
    """scalekit.generate, scripted: decode tokens/s and agreement per toggle, no model run."""

    def __init__(self, speed, agreement):
        self.speed, self.agreement, self.calls = speed, agreement, []

    def __call__(self, cfg, stop=None, hw=None, catch_errors=False):
        from scalekit.inference.results import GenerateResult
        from scalekit.training.results import Spread

        self.calls.append(dict(cfg.toggles))
        tps = 100.0
        agreement = 1.0
        for name in cfg.toggles:
            tps *= self.speed.get(name, 1.0)
            agreement = min(agreement, self.agreement.get(name, 1.0))
        return GenerateResult(label=cfg.describe(), config=cfg.to_dict(), decode_tokens_per_s=tps,
                              decode_ms=Spread.of([1e3 / tps]), peak_mem_bytes=1000, agreement=agreement,
                              perplexity=4.0 / agreement, reference_perplexity=4.0, compile_s=0.0)
