"""`scalekit predict MODEL --gpus 8xH100-SXM --toggle fsdp --toggle checkpointing=selective ...`: predict's table
on the command line (the parser's part and the command; scalekit/cli registers them)."""

from __future__ import annotations

import argparse
import re

from ..errors import ConfigError, ForkUnsafeError

# predict's and plan_for's arguments as the command line spells them, for the refusals that name them
FLAG_OF = {"gpus": "--gpus", "per_node": "--per-node", "batch_size": "--batch-size", "seq_len": "--seq-len",
           "budget_bytes_per_gpu": "--budget-gb", "toggles": "--toggle"}


def cannot_calibrate(exc: ForkUnsafeError, gpus: str) -> ConfigError:
    """A part measured here ("this-cpu") needs calibrate()'s ranks, which this process cannot fork: one line."""
    reasons = "; ".join(line.strip(" -") for line in str(exc).splitlines()[1:] if line.strip())
    return ConfigError(f"--gpus {gpus}: measuring this machine (calibrate) starts ranks, which cannot be forked "
                       f"from this process: {reasons}")


def said_as_flags(exc: ConfigError) -> ConfigError:
    """The refusal with each argument it names (`gpus=...`) written as its flag (`--gpus ...`)."""
    words = re.sub(r"\b(" + "|".join(FLAG_OF) + r")=", lambda m: FLAG_OF[m.group(1)] + " ", str(exc))
    words = re.sub(r"(?<![\w-])(" + "|".join(FLAG_OF) + r")\b", lambda m: FLAG_OF[m.group(1)], words)
    if words.startswith("unknown part"):  # a part is only ever named by --gpus
        words = f"--gpus: {words}"
    return ConfigError(words)


def add_parser(sub) -> argparse.ArgumentParser:
    from .parts import PARTS
    from .shapes import PUBLIC

    p = sub.add_parser("predict", help="predict memory, step time, tokens/s and MFU per GPU for GPUs not here",
                       description="Predict one training step of MODEL on GPUS: memory per GPU and whether it fits, "
                                   "compute, exposed communication per collective, the pipeline bubble, tokens/s "
                                   "per GPU, MFU, and the assumptions.")
    p.add_argument("model", metavar="MODEL", help=f"a public shape ({', '.join(PUBLIC)}) or a built-in preset")
    p.add_argument("--gpus", default="8xH100-SXM", metavar="NxPART",
                   help=f"COUNTxPART, nodes of 8 (parts: {', '.join(PARTS)}, this-cpu); default 8xH100-SXM")
    p.add_argument("--per-node", type=int, default=None, metavar="N", help="GPUs per node (default 8)")
    p.add_argument("--toggle", action="append", default=[], metavar="NAME[=VALUE]",
                   help="fsdp, ddp, zero=zero1|zero2, tensor_parallel=N, pipeline_parallel=1f1b/8,stages=S, bf16, "
                        "checkpointing=selective|N, sdpa; repeatable")
    p.add_argument("--batch-size", type=int, default=None, help="the global batch in rows")
    p.add_argument("--seq-len", type=int, default=None, help="tokens per row")
    return p


def run(args, stop=None) -> int:
    from .step import predict

    toggles = dict(_toggle_arg(t) for t in args.toggle)
    try:
        p = predict(args.model, args.gpus, toggles=toggles, batch_size=args.batch_size, seq_len=args.seq_len,
                    per_node=args.per_node)
    except ConfigError as exc:
        raise said_as_flags(exc) from None
    except ForkUnsafeError as exc:
        raise cannot_calibrate(exc, args.gpus) from None
    print(p.table())
    return 0


def _toggle_arg(text: str) -> tuple[str, object]:
    """'NAME=VALUE' as (name, value): a whole number as an int, no value as True (the --toggle of the other commands)."""
    name, _, value = text.partition("=")
    from .inputs import as_number

    return name, as_number(value) if value else True


def add_plan_parser(sub) -> argparse.ArgumentParser:
    """`scalekit plan-for MODEL --gpus 64xH100-SXM [--budget-gb N] [--batch-size B] [--seq-len T] [--toggle ...]`."""
    from .shapes import PUBLIC

    p = sub.add_parser("plan-for", help="rank the parallel plans of MODEL on GPUS by predicted tokens/s per GPU",
                       description="Predict every parallel plan of MODEL on GPUS (DDP, FSDP, ZeRO-1/2, tensor and "
                                   "pipeline degrees, schedules, micro-batches, checkpointing), refuse those that "
                                   "do not fit with their numbers, rank the rest by tokens/s per GPU, and say why "
                                   "the winner wins and what each runner-up lacks.")
    p.add_argument("model", metavar="MODEL", help=f"a public shape ({', '.join(PUBLIC)}) or a built-in preset")
    p.add_argument("--gpus", default="8xH100-SXM", metavar="NxPART", help="COUNTxPART, nodes of 8; default 8xH100-SXM")
    p.add_argument("--per-node", type=int, default=None, metavar="N", help="GPUs per node (default 8)")
    p.add_argument("--budget-gb", type=float, default=None, metavar="GIB",
                   help="memory budget per GPU in GiB (default: the part's memory)")
    p.add_argument("--toggle", action="append", default=[], type=_toggle_arg, metavar="NAME[=VALUE]",
                   help="added to every plan (bf16, sdpa, ...); a parallel or checkpointing toggle fixes that "
                        "dimension instead of searching it; repeatable")
    p.add_argument("--batch-size", type=int, default=None, help="the global batch in sequences (default: one per GPU)")
    p.add_argument("--seq-len", type=int, default=None, help="tokens per sequence")
    p.add_argument("--top", type=int, default=15, help="rows of the table to print (default 15)")
    return p


def run_plan(args, stop=None) -> int:
    from .search import plan_for

    toggles = dict(args.toggle)
    budget = args.budget_gb * 2**30 if args.budget_gb is not None else None
    try:
        s = plan_for(args.model, args.gpus, budget_bytes_per_gpu=budget, batch_size=args.batch_size,
                     seq_len=args.seq_len, toggles=toggles, per_node=args.per_node)
    except ConfigError as exc:
        raise said_as_flags(exc) from None
    except ForkUnsafeError as exc:
        raise cannot_calibrate(exc, args.gpus) from None
    print(s.table(top=args.top))
    return 0 if s.plans else 1
