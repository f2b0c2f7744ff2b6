"""Runs exported training code, as a user would, and says what it did (tests/hf/test_hf_export_runs.py starts it).

Reads a JSON list of {"id", "code", "samples"} on stdin; executes each code in a fresh directory with `config` (a
tiny GPT-2 config, built offline) and `train_dataset` (that many windows of the shipped corpus) defined, or with what
a case's "prelude" defines (your own model's code: `model`, `loss_fn`, `train_dataset` of `samples` samples), and
prints one line per case, "RESULT {json}": the optimizer steps taken, the optimizer (and its state's bits), the
parameters it trained, the model's module classes, the Accelerator's precision, the accumulation (the Accelerator's
or Lightning Trainer's), the dtypes autocast ran forward passes in, the first DataLoader's options, whether activation
checkpointing is on, the torch.compile calls; or the error.  It records through hooks and wrappers, never by changing
the code it runs; the one thing it changes is the backend torch.compile lowers to (see `compile_with`).  Every
network connection is refused (`refuse_network`): the exported code runs offline, as it must on a CI machine.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import tempfile
import time
import traceback

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.utils.data import DataLoader

from scalekit.hf import CorpusDataset, model_config

seen: dict[str, list] = {}


network_attempts: list[str] = []  # since the last case's report (the first case's: since the runner started)


def refused(connect):
    """`connect` for local (AF_UNIX) sockets, which DataLoader workers hand tensors back through; any other
    connection is counted and refused."""
    def refuse_network(sock, address):
        if sock.family == socket.AF_UNIX:
            return connect(sock, address)
        network_attempts.append(repr(address))
        raise OSError(f"run_exported: no network connection may be attempted (to {address!r})")
    return refuse_network


socket.socket.connect = refused(socket.socket.connect)
socket.socket.connect_ex = refused(socket.socket.connect_ex)
top_level = [0]  # depth of nested Module.train calls: only the outermost call names the model being trained


def record(key: str, value) -> None:
    seen.setdefault(key, []).append(value)


register_optimizer_step_post_hook(lambda optimizer, args, kwargs: record("steps", optimizer))

original_train = torch.nn.Module.train


def train(self, mode: bool = True):
    if mode and not top_level[0]:
        record("model", self)
    top_level[0] += 1
    try:
        return original_train(self, mode)
    finally:
        top_level[0] -= 1


torch.nn.Module.train = train
original_loader_init = DataLoader.__init__


def loader_init(self, *args, **kwargs):
    original_loader_init(self, *args, **kwargs)
    record("loader", {"batch_size": self.batch_size, "drop_last": self.drop_last, "num_workers": self.num_workers})


DataLoader.__init__ = loader_init
original_compile = torch.compile


def compile_with(model=None, **kwargs):
    if isinstance(model, torch.nn.Module):  # the model the code compiles (libraries compile functions of their own)
        record("compile", {"backend": kwargs.get("backend", "inductor"), "mode": kwargs.get("mode")})
    # inductor's code generation takes ≈35 s cold on a 2-core CPU: the graph capture the exported code asks for
    # runs in full (dynamo traces the model), run by the eager backend instead (what was asked for is recorded above)
    return original_compile(model, **{**kwargs, "backend": "eager", "mode": None})


torch.compile = compile_with
original_checkpoint = torch.utils.checkpoint.checkpoint


def checkpoint_with(function, *args, **kwargs):
    record("checkpoint", kwargs.get("use_reentrant"))
    return original_checkpoint(function, *args, **kwargs)


torch.utils.checkpoint.checkpoint = checkpoint_with  # what the exported code imports, and Transformers' layers call
try:
    import accelerate
    from accelerate.state import AcceleratorState, GradientState

    original_accelerator_init = accelerate.Accelerator.__init__

    def accelerator_init(self, *args, **kwargs):
        original_accelerator_init(self, *args, **kwargs)
        record("accelerator", self)

    accelerate.Accelerator.__init__ = accelerator_init
except ImportError:  # Lightning's code needs no Accelerate
    AcceleratorState = GradientState = None
try:
    import lightning

    original_fit = lightning.Trainer.fit

    def fit(self, model, *args, **kwargs):
        # Lightning never calls Module.train (it trains the modules in the mode it finds them): the model trained is
        # the one the exported LightningModule holds as `self.model`, recorded here as the other targets' is in train
        record("model", getattr(model, "model", model))
        record("lightning_trainer", self)
        return original_fit(self, model, *args, **kwargs)

    lightning.Trainer.fit = fit
except ImportError:  # the Trainer's and Accelerate's code need no Lightning
    pass


def autocast_seen(module, args) -> None:
    # the dtype the forward passes ran under autocast (mixed precision as it happened, whoever switched it on)
    for device in ("cpu", "cuda"):
        if torch.is_autocast_enabled(device):
            seen.setdefault("autocast", set()).add(str(torch.get_autocast_dtype(device)).removeprefix("torch."))


torch.nn.modules.module.register_module_forward_pre_hook(autocast_seen)


def accumulation(lightning_trainer, accelerator) -> int | None:
    if lightning_trainer is not None:
        return lightning_trainer.accumulate_grad_batches
    return None if accelerator is None else accelerator.gradient_accumulation_steps


def summary() -> dict:
    optimizer, model = seen["steps"][-1], seen["model"][-1]
    names = {id(p): n for n, p in model.named_parameters()}
    trained = [p for group in optimizer.param_groups for p in group["params"] if p.requires_grad]
    accelerator = seen.get("accelerator", [None])[-1]
    trainer = seen.get("lightning_trainer", [None])[-1]
    return {"steps": len(seen["steps"]), "optimizer": f"{type(optimizer).__module__}.{type(optimizer).__name__}",
            "optimizer_bits": getattr(getattr(optimizer, "args", None), "optim_bits", None),  # bitsandbytes' state
            "trained": sorted(names.get(id(p), "?") for p in trained), "trained_numel": sum(p.numel() for p in trained),
            "modules": sorted({type(m).__name__ for m in model.modules()}),
            "mixed_precision": None if accelerator is None else str(accelerator.mixed_precision),
            "accumulation": accumulation(trainer, accelerator),
            "autocast": sorted(seen.get("autocast", [])),
            "loader": seen["loader"][0], "compile": seen.get("compile", []),
            "checkpointing": any(getattr(m, "gradient_checkpointing", False) is True for m in model.modules()),
            "checkpoint_calls": len(seen.get("checkpoint", []))}


def main() -> None:
    # one thread: tiny models gain nothing from two, and a shared CPU swings their step times (DESIGN.md)
    torch.set_num_threads(1)
    corpus = CorpusDataset(seq_len=16)
    home = os.getcwd()
    for case in json.load(sys.stdin):
        seen.clear()
        if AcceleratorState is not None:  # each case starts as a fresh process would (Accelerate keeps one state)
            AcceleratorState._reset_state(True)
            GradientState._reset_state()
        with tempfile.TemporaryDirectory() as where:
            os.chdir(where)  # the Trainer's output_dir, the quantized base's copy
            namespace = {"config": model_config("gpt2", "tiny"),
                         "train_dataset": [corpus[i] for i in range(case["samples"])], "samples": case["samples"]}
            start = time.perf_counter()
            try:
                if "prelude" in case:
                    exec(case["prelude"], namespace)
                exec(compile(case["code"], f"{case['id'].replace('/', '_')}.py", "exec"), namespace)
                facts = {**summary(), "run_s": round(time.perf_counter() - start, 2)}
            except BaseException:  # every failure is the case's result, reported
                facts = {"error": traceback.format_exc()[-4000:]}
            os.chdir(home)
        facts["network_attempts"] = network_attempts[:]  # reported with an error too
        network_attempts.clear()
        print("RESULT " + json.dumps({"id": case["id"], **facts}), flush=True)


if __name__ == "__main__":
    main()
