"""`scalekit predict MODEL --gpus 8xH100-SXM --toggle fsdp --toggle checkpointing=selective ...`: predict's table
on the command line (the parser's part and the command; scalekit/cli registers them)."""

from __future__ import annotations

import argparse


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

    toggles = {}
    for t in args.toggle:
        name, _, value = t.partition("=")
        toggles[name] = (int(value) if value.isdigit() else value) if value else True
    p = predict(args.model, args.gpus, toggles=toggles, batch_size=args.batch_size, seq_len=args.seq_len,
                per_node=args.per_node)
    print(p.table())
    return 0
