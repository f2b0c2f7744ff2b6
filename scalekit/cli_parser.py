"""The command line's parser: its subcommands and options, and the flag each config field is spelled as."""

from __future__ import annotations

import argparse
import functools
import re

from .config import PRESET_NAMES
from .ladder import LADDERS
from .launch import commands as launch_commands
from .toggles import TOGGLES


def _toggle_arg(text: str) -> tuple[str, object]:
    name, _, value = text.partition("=")
    return name, (value if value else True)


def _run_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", default="auto", help=f"model size: {', '.join(PRESET_NAMES)} (default: auto)")
    p.add_argument("--batch-size", type=int, default=None, help="sequences per step (default: the preset's)")
    p.add_argument("--seq-len", type=int, default=None, help="tokens per sequence (default: the preset's)")
    p.add_argument("--steps", type=int, default=20, help="measured steps (default 20)")
    p.add_argument("--warmup-steps", type=int, default=3, help="unmeasured warm-up steps (default 3)")
    p.add_argument("--log-every", type=int, default=5, help="read the loss every N steps (default 5)")
    p.add_argument("--data", default="auto", help="shakespeare, shakespeare-raw, synthetic, new-plays (the tail the "
                                                   "shipped model never saw, for fine-tuning) or auto (default)")
    p.add_argument("--transform-rounds", type=int, default=None, metavar="N",
                   help="with --data shakespeare-raw: its per-sample transform's cost (hash rounds per token)")
    p.add_argument("--init", default="random", help="the built-in GPT's starting weights: random (default) or "
                                                    "pretrained (preset shakespeare-char)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--peak-tflops", type=float, default=None, help="device dense peak for MFU, if not in the table")
    p.add_argument("--no-memory-check", dest="check_memory", action="store_false",
                   help="run even when the planned peak memory is over this machine's limit (RAM, the "
                        "container's cgroup limit, or a GPU's free memory)")
    p.add_argument("--hf-model", default=None, metavar="FAMILY",
                   help="a Hugging Face model (gpt2 or llama) built offline in the preset's shape, instead of "
                        "scalekit's GPT (needs transformers)")
    _threads_option(p)


def _threads_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--threads", type=int, default=None, metavar="N",
                   help="torch's intra-op threads (default: the cores other processes are not already using, "
                        "at least one)")


def _generate_options(p: argparse.ArgumentParser, ladder: bool = False) -> None:
    """Options of `scalekit generate`; the inference ladder takes them too (the training ladder ignores them)."""
    what = "inference ladder: " if ladder else ""
    p.add_argument("--prompt", action="append", default=None, metavar="TEXT",
                   help=f"{what}a prompt (repeatable: a batch of prompts; default 'ROMEO:')")
    p.add_argument("--max-new-tokens", type=int, default=None,
                   help=f"{what}tokens generated per prompt (default 200, cut to fit the model's context)")
    p.add_argument("--model", default=None, help=f"{what}shakespeare-char (the shipped model, default) or a preset "
                                                 f"name for random weights")
    p.add_argument("--quality-seq-len", type=int, default=None, metavar="N",
                   help=f"{what}tokens per held-out window of the quality measures (default 256, cut to the context)")
    if ladder:
        return
    p.add_argument("--hf-model", default=None, metavar="FAMILY",
                   help="a Hugging Face model (gpt2 or llama) built offline with random weights in the shape of "
                        "--model's preset (default: this machine's), instead of scalekit's GPT (needs transformers)")
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy (default); above 0: sampled")
    p.add_argument("--top-k", type=int, default=None, help="with sampling: draw from the k most likely tokens")
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    p.add_argument("--warmup-tokens", type=int, default=8, help="tokens of the unmeasured warm-up (default 8)")
    _threads_option(p)
    p.add_argument("--no-quality", dest="quality", action="store_false",
                   help="skip perplexity and agreement on held-out text")


class OneLineParser(argparse.ArgumentParser):
    """argparse, with its refusals in one line that names the flag (not the usage block above it); the
    subcommands' parsers are of this class too (argparse makes them of the parent's)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def parser() -> argparse.ArgumentParser:
    """The command line's parser, built once for each set of registered toggles and ladders (a parser keeps no
    state between parse_args calls; building one is ~140 add_argument calls, 5 ms, which a program calling main()
    in a loop would otherwise pay every time)."""
    return _parser(tuple(TOGGLES), tuple(LADDERS))


@functools.lru_cache(maxsize=4)
def _parser(toggle_names: tuple[str, ...], ladder_kinds: tuple[str, ...]) -> argparse.ArgumentParser:
    p = OneLineParser(prog="scalekit", description="Switch training optimizations on and measure them.")
    sub = p.add_subparsers(dest="command", required=True)
    _measure_commands(sub)
    _export_command(sub)
    _generate_command(sub)
    _tune_command(sub)
    launch_commands.add_parser(sub)
    sub.add_parser("doctor", help="device facts, peak FLOP/s for MFU, what works here")
    tog = sub.add_parser("toggles", help="list every toggle with its summary and cost; NAME: its explainer and code")
    tog.add_argument("name", nargs="?", default=None, metavar="NAME",
                     help=f"one toggle: its explainer and the code it runs ({', '.join(TOGGLES)})")
    tog.add_argument("--hf-model", default=None, metavar="FAMILY",
                     help="what applies to a Hugging Face model (gpt2 or llama, built offline): every toggle for "
                          "training and generation, with the reason")
    tog.add_argument("--preset", default="auto", help="with --hf-model: the shape it is built in (default: auto)")
    tog.add_argument("--device", default="auto", help="with --hf-model: the device asked about (auto, cpu, cuda)")
    return p


def _toggle_option(p: argparse.ArgumentParser, help: str) -> None:  # noqa: A002 - argparse's own word
    p.add_argument("--toggle", action="append", default=[], type=_toggle_arg, metavar="NAME[=MODE]", help=help)


# paired rounds per row: on a shared 2-core machine 3 rounds found an injected 1.3x slowdown in 14 of 20
# comparisons and 5 in 18 of 20 with a busy loop beside them (benchmarks/aa_noise.py); no false claim at either
DEFAULT_REPEATS = 5


def _measure_commands(sub) -> None:
    """ladder, bench and plan: measuring (or planning) training runs."""
    lad = sub.add_parser("ladder", help="baseline, then each optimization switched on cumulatively")
    lad.add_argument("kind", nargs="?", default="train", choices=list(LADDERS),
                     help="which ladder: train (the model's optimizations, the default), data (chapter 05's), "
                          "finetune (chapter 09's) or inference (chapter 06's)")
    _run_options(lad)
    lad.add_argument("--json", metavar="PATH", help="write every run's full result as JSON")
    lad.add_argument("--repeats", type=int, default=DEFAULT_REPEATS, metavar="N",
                     help=f"measure every row N times, the order alternating, so each speed-up's interval covers the "
                          f"machine changing between runs (default {DEFAULT_REPEATS}; 1: one run each, quicker)")
    _generate_options(lad, ladder=True)
    bench = sub.add_parser("bench", help="measure one configuration")
    _run_options(bench)
    _toggle_option(bench, f"switch an optimization on (repeatable): {', '.join(TOGGLES)}")
    bench.add_argument("--json", metavar="PATH", help="write the full result as JSON")
    bench.add_argument("--nproc-per-node", type=int, default=None, metavar="N",
                       help="run it in N processes on this machine, as the ddp/fsdp toggles need (default: 1)")
    bench.add_argument("--timeout-s", type=float, default=None, metavar="S",
                       help="with --nproc-per-node: stop the processes after S seconds (default: no limit)")
    plan = sub.add_parser("plan", help="predict memory (params, grads, optimizer state, activations) and FLOPs")
    _run_options(plan)
    _toggle_option(plan, "as for bench")


def _export_command(sub) -> None:
    export = sub.add_parser("export", help="print the code that trains with these toggles in Transformers, "
                                           "Accelerate or Lightning")
    export.add_argument("target", choices=["hf", "accelerate", "lightning"], help="the framework to write code for")
    _run_options(export)
    _toggle_option(export, "as for bench")
    export.add_argument("--lr", type=float, default=None, help="learning rate (default: RunConfig's, 1e-3)")
    export.add_argument("--world-size", type=int, default=1, metavar="N",
                        help="processes the framework runs in, for ddp/fsdp/deepspeed (default 1)")


def _generate_command(sub) -> None:
    gen = sub.add_parser("generate", help="generate text from the built-in GPT and measure it (prefill, "
                                          "per-token latency, tokens/s, weight and KV-cache bytes, quality)")
    _generate_options(gen)
    _toggle_option(gen, "switch an inference optimization on (repeatable): inference_mode, kv_cache[=static], "
                        "compile, sdpa, bf16, tf32, quantize=METHOD")
    gen.add_argument("--json", metavar="PATH", help="write the full result as JSON")


def _tune_command(sub) -> None:
    tune = sub.add_parser("tune", help="search for the fastest configuration within a memory budget (autotune)")
    _run_options(tune)
    _toggle_option(tune, "toggles to try first, as one candidate against the baseline (kept only if faster; "
                         "each switched off again once the rest is settled)")
    tune.add_argument("--budget-mb", type=float, default=None, help="peak-memory budget in MiB (default: none)")
    tune.add_argument("--time-budget-s", type=float, default=300.0, help="longest the search may take (default 300)")
    tune.add_argument("--run-steps", type=int, default=1000,
                      help="steps of the real run you plan: one-off costs (compile) must pay off over them")
    tune.add_argument("--json", metavar="PATH", help="write the search (every candidate and why) as JSON")
    tune.add_argument("--generate", action="store_true",
                      help="tune generation instead of training: the inference toggles, decode tokens/s, quality kept "
                           "(--run-steps is then the tokens the real workload generates)")
    _generate_options(tune, ladder=True)
    tune.add_argument("--export", choices=["hf", "accelerate", "lightning"], default=None,
                      help="also print the winner as code for Transformers (TrainingArguments), Accelerate or "
                           "Lightning")


GENERATE_FLAGS = {"prompts": "--prompt", "max_new_tokens": "--max-new-tokens", "model": "--model",
                  "quality_seq_len": "--quality-seq-len",
                  "temperature": "--temperature", "top_k": "--top-k", "seed": "--seed", "device": "--device",
                  "warmup_tokens": "--warmup-tokens", "toggles": "--toggle", "threads": "--threads"}
FLAGS = {"batch_size": "--batch-size", "seq_len": "--seq-len", "steps": "--steps", "warmup_steps": "--warmup-steps",
         "log_every": "--log-every", "data": "--data", "transform_rounds": "--transform-rounds", "device": "--device",
         "seed": "--seed", "preset": "--preset", "peak_tflops": "--peak-tflops", "toggles": "--toggle",
         "check_memory": "--no-memory-check", "init": "--init", "model": "--hf-model", "lr": "--lr",
         "threads": "--threads"}


def flag_names(message: str) -> str:
    """A RunConfig error with the command-line flag it is about: '... (flag: --steps)'."""
    flags = [FLAGS[f] for f in dict.fromkeys(re.findall(r"RunConfig\.(\w+)", message)) if f in FLAGS]
    flags += [GENERATE_FLAGS[f] for f in dict.fromkeys(re.findall(r"GenerateConfig\.(\w+)", message))
              if f in GENERATE_FLAGS]
    return f"{message} (flag: {', '.join(flags)})" if flags else message
