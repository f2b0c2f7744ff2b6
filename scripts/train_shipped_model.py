"""Train the GPT that scalekit ships (scalekit/models/weights/shakespeare_char.{pt,json}).

    PYTHONPATH=. python3 scripts/train_shipped_model.py            # reproduces the shipped files

A character-level GPT trained by scalekit's own loop (scalekit.training.build.build + train_step) on the "train" split
of the shipped corpus (its first 90%).  The held-out tail (the "val" split, last 10%) is never trained on:
it only measures the loss, and the fine-tuning chapter uses it as new data.  A sequence-length curriculum
keeps the run short on a CPU: the first steps at 256 tokens, then the full 1024 so every position
embedding is trained.  The 1024 phase must come while the learning rate is still high: a first version
ran 2200 steps at 256 and only the last 300 at 1024 (lr 4e-4 → 3e-4), and positions 256..1023 stayed
near their initial embeddings (held-out loss 1.46 on positions < 256, ≈2.5 beyond).  The learning rate warms up linearly, then follows one cosine decay over all phases.
Same arguments, same thread count, same torch build: the same weights (their digest is in the JSON).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import hashlib
import json
import math
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from scalekit import RunConfig, build, detect
from scalekit.data import CharTokenizer, corpus_text, load_tokens
from scalekit.models import GPT, GPTConfig
from scalekit.models.pretrained import config_fields, heldout_loss, heldout_loss_by_part, state_dict_sha256
from scalekit.training.build import gpt_loss, train_step

REPO = Path(__file__).resolve().parent.parent
SHAPE = GPTConfig(block_size=1024, vocab_size=65, n_layer=4, n_head=4, n_embd=128, attention="sdpa")
QUICK_CHECK = dict(seq_len=1024, n_windows=4)  # the fast re-measurement tests/models/test_pretrained.py repeats


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--phases", nargs="+", default=["256:16:1000", "1024:4:1500"],
                   help="SEQ_LEN:BATCH:STEPS for each phase, in order (default: %(default)s)")
    p.add_argument("--lr", type=float, default=3e-3, help="peak learning rate (AdamW)")
    p.add_argument("--min-lr", type=float, default=3e-4, help="learning rate at the end of the cosine decay")
    p.add_argument("--warmup-steps", type=int, default=100, help="linear warm-up from 0 to --lr")
    p.add_argument("--seed", type=int, default=1337, help="seed for the weights and the batch offsets")
    # one thread: the fastest on a shared 2-core machine (two threads wait on each other when a core is
    # busy), and the most reproducible (a reduction's order can depend on the thread count)
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (results depend on it)")
    p.add_argument("--log-every", type=int, default=50, help="read and print the loss every N steps")
    p.add_argument("--out", default="scalekit/models/weights", help="directory for the .pt and .json")
    p.add_argument("--name", default="shakespeare_char", help="file stem of the .pt and .json")
    # the shape: the defaults are the shipped model's; the draft model for speculative decoding is the same
    # recipe at a fraction of the size (weights/README.md has its command)
    p.add_argument("--n-layer", type=int, default=SHAPE.n_layer, help="transformer blocks")
    p.add_argument("--n-head", type=int, default=SHAPE.n_head, help="attention heads")
    p.add_argument("--n-embd", type=int, default=SHAPE.n_embd, help="width")
    args = p.parse_args(argv)
    args.shape = GPTConfig(**{**config_fields(SHAPE), "n_layer": args.n_layer, "n_head": args.n_head,
                              "n_embd": args.n_embd})
    args.phases = [dict(zip(("seq_len", "batch_size", "steps"), map(int, s.split(":")), strict=True))
                   for s in args.phases]
    return args


def lr_at(step: int, total: int, args) -> float:
    """Linear warm-up to the peak, then cosine decay to min_lr at the last step."""
    if step < args.warmup_steps:
        return args.lr * (step + 1) / args.warmup_steps
    progress = (step - args.warmup_steps) / max(1, total - 1 - args.warmup_steps)
    return args.min_lr + 0.5 * (args.lr - args.min_lr) * (1 + math.cos(math.pi * progress))


class RandomWindows:
    """Batches of windows at random offsets in the training tokens, drawn from one seeded generator."""

    def __init__(self, tokens, seed: int):
        self.data = torch.from_numpy(tokens.astype("int64"))
        self.generator = torch.Generator().manual_seed(seed)

    def __call__(self, batch_size: int, seq_len: int):
        starts = torch.randint(len(self.data) - seq_len - 1, (batch_size,), generator=self.generator)
        x = torch.stack([self.data[s: s + seq_len] for s in starts.tolist()])
        y = torch.stack([self.data[s + 1: s + seq_len + 1] for s in starts.tolist()])
        return x, y


def train(args, windows: RandomWindows, stack: contextlib.ExitStack):
    """Build the run with scalekit's engine and step it through the phases; returns (ctx, log)."""
    first = args.phases[0]
    cfg = RunConfig(model=lambda: GPT(args.shape), batch_fn=lambda b, device: windows(b, first["seq_len"]),
                    loss_fn=gpt_loss, tokens_per_sample=first["seq_len"], batch_size=first["batch_size"],
                    lr=args.lr, seed=args.seed, device="cpu", toggles=["fused_adamw"], label="shipped model")
    hw = detect("cpu")
    ctx = build(cfg.resolve(hw), hw, stack)
    total = sum(ph["steps"] for ph in args.phases)
    log, step, tokens_seen, t0 = [], 0, 0, time.perf_counter()
    for ph in args.phases:
        t_phase, tokens_phase = time.perf_counter(), 0
        for _ in range(ph["steps"]):
            for group in ctx.optimizer.param_groups:
                group["lr"] = lr_at(step, total, args)
            loss = train_step(ctx, windows(ph["batch_size"], ph["seq_len"]))
            step += 1
            tokens_seen += ph["batch_size"] * ph["seq_len"]
            tokens_phase += ph["batch_size"] * ph["seq_len"]
            if step % args.log_every == 0 or step == total:
                value = loss.item()  # a sync point: only every log_every steps
                rate = tokens_phase / (time.perf_counter() - t_phase)
                log.append(dict(step=step, loss=round(value, 4), lr=ctx.optimizer.param_groups[0]["lr"]))
                print(f"step {step}/{total} seq {ph['seq_len']} loss {value:.4f} lr {log[-1]['lr']:.2e} "
                      f"{rate:,.0f} tok/s  {time.perf_counter() - t0:,.0f} s", flush=True)
        ph["tokens_per_s"] = round(tokens_phase / (time.perf_counter() - t_phase))
        ph["wall_s"] = round(time.perf_counter() - t_phase, 1)
    return ctx, log, tokens_seen, time.perf_counter() - t0


def write_atomic(path: Path, write) -> None:
    """write(f) into a temporary file in path's directory, flushed and fsynced, then renamed over path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes it private; a package file is world-readable
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def greedy_and_seeded(model: GPT, tok: CharTokenizer, prompt: str = "ROMEO:", n: int = 300, seed: int = 0):
    idx = torch.tensor([tok.encode(prompt)])
    greedy = model.generate(idx, n, top_k=1)  # top_k=1: the argmax every step
    seeded = model.generate(idx, n, temperature=0.8, top_k=None, generator=torch.Generator().manual_seed(seed))
    return tok.decode(greedy[0].tolist()), tok.decode(seeded[0].tolist())


def optimizer_settings(optimizer: torch.optim.Optimizer) -> dict:
    group = optimizer.param_groups[0]
    return dict(kind=type(optimizer).__name__, betas=list(group["betas"]), eps=group["eps"],
                weight_decay=group["weight_decay"], fused=bool(group.get("fused")), grad_clip=None)


def provenance(args, ctx, log, tokens_seen: int, wall_s: float, val, train_tokens) -> dict:
    model = ctx.base_model
    text = corpus_text()
    tok = CharTokenizer(text)
    T = args.shape.block_size
    full = dict(split="val", seq_len=T, n_windows=(len(val) - 1) // T, batch_size=8)
    quick = dict(split="val", **QUICK_CHECK)
    train_same = dict(split="train", seq_len=T, n_windows=full["n_windows"])
    greedy, seeded = greedy_and_seeded(model, tok)
    return {
        "name": args.name.replace("_", "-"),
        "config": config_fields(GPTConfig(**{**config_fields(args.shape), "attention": "manual"})),
        "trained_with_attention": args.shape.attention,
        "parameters": sum(p.numel() for p in model.parameters()),
        "tokenizer": {"kind": "CharTokenizer", "chars": tok.chars},
        "corpus": {"file": "scalekit/data/tinyshakespeare.txt", "sha256": hashlib.sha256(text.encode()).hexdigest(),
                   "train_tokens": len(train_tokens), "val_tokens": len(val),
                   "split": "train = first 90% of the characters, val = the last 10%; only train is trained on"},
        "training": {
            "loop": "scalekit.training.build.build + scalekit.training.build.train_step (toggles: fused_adamw)",
            "phases": args.phases, "steps": sum(ph["steps"] for ph in args.phases), "tokens_seen": tokens_seen,
            "batches": "windows at uniformly random offsets in the train split (torch.Generator seeded with seed)",
            "optimizer": optimizer_settings(ctx.optimizer),
            "lr_schedule": {"kind": "linear warm-up then cosine decay to min_lr over all steps", "peak_lr": args.lr,
                            "min_lr": args.min_lr, "warmup_steps": args.warmup_steps},
            "seed": args.seed, "torch_threads": torch.get_num_threads(), "wall_s": round(wall_s, 1),
            "loss_log": log,
        },
        "heldout_loss_nats_per_char": heldout_loss(model, val, T, full["n_windows"]),
        "heldout_loss_measured_on": full | {"how": "eval mode, no grad, mean cross-entropy over every "
                                            "predicted character of consecutive non-overlapping windows "
                                            "from the start of the split (scalekit.models.pretrained.heldout_loss)"},
        "heldout_loss_by_position_quarter": heldout_loss_by_part(model, val, T, full["n_windows"], parts=4),
        "heldout_loss_at_seq_len_256": heldout_loss(model, val, 256),
        "train_loss_nats_per_char": heldout_loss(model, train_tokens, T, train_same["n_windows"]),
        "train_loss_measured_on": train_same | {"how": "the same measure on the start of the train split"},
        "quick_check": quick | {"loss_nats_per_char": heldout_loss(model, val, QUICK_CHECK["seq_len"],
                                                                  QUICK_CHECK["n_windows"])},
        "state_dict_sha256": state_dict_sha256(model.state_dict()),
        "samples": {"prompt": "ROMEO:", "greedy_300": greedy, "seeded_300": seeded,
                    "seeded_how": "model.generate(temperature=0.8, generator=torch.Generator().manual_seed(0))"},
        "torch_version": torch.__version__, "python": platform.python_version(), "machine": platform.machine(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "script": "scripts/train_shipped_model.py",
        "command": " ".join(["python3", *map(shlex.quote, sys.argv)]),
        "script_commit": script_commit(),
    }


def script_commit() -> str | None:
    """The commit this script was run from (with "+changes" when the script differs from it)."""
    def git(*a):
        return subprocess.run(["git", "-C", str(REPO), *a], capture_output=True, text=True, timeout=30)
    head = git("rev-parse", "HEAD")
    if head.returncode != 0:
        return None
    dirty = git("diff", "--quiet", "HEAD", "--", "scripts/train_shipped_model.py", "scalekit").returncode != 0
    return head.stdout.strip() + ("+changes" if dirty else "")


def main(argv=None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)
    train_tokens, val = load_tokens("train"), load_tokens("val")
    windows = RandomWindows(train_tokens, args.seed)
    with contextlib.ExitStack() as stack:
        ctx, log, tokens_seen, wall_s = train(args, windows, stack)
        ctx.base_model.eval()
        info = provenance(args, ctx, log, tokens_seen, wall_s, val, train_tokens)
        state = ctx.base_model.state_dict()  # plain fp32 tensors; the tied embedding/lm_head stored once
    out = Path(args.out) if os.path.isabs(args.out) else REPO / args.out
    write_atomic(out / f"{args.name}.pt", lambda f: torch.save(state, f))
    write_atomic(out / f"{args.name}.json", lambda f: f.write((json.dumps(info, indent=1) + "\n").encode()))
    print(f"held-out loss {info['heldout_loss_nats_per_char']:.4f} nats/char, train {info['train_loss_nats_per_char']:.4f}; "
          f"wrote {out / args.name}.pt and .json")
    print("greedy:", info["samples"]["greedy_300"], "\nseeded:", info["samples"]["seeded_300"], sep="\n")


if __name__ == "__main__":
    main()
