"""The command line's parser: its subcommands and options (a config field's flag is derived: scalekit.cli.fields)."""

from __future__ import annotations

import argparse
import functools
import re

from ..inference.config import GenerateConfig
from ..launch import commands as launch_commands
from ..predict import command as predict_command
from ..toggles import TOGGLES
from ..training.config import RunConfig
from ..training.ladder import LADDERS
from .fields import add_field_flags, flags_of


def _toggle_arg(text: str) -> tuple[str, object]:
    name, _, value = text.partition("=")
    return name, (value if value else True)


def _run_options(p: argparse.ArgumentParser, generation: bool = False) -> None:
    """Every RunConfig field's flag (scalekit.cli.fields derives them), --hf-model for its model, and --model,
    --loss-fn, --batch-fn for code of your own.  generation: the command also generates (ladder inference, tune
    --generate), where --model also takes a generation model's name."""
    add_field_flags(p, RunConfig)
    _hf_model_option(p, "a Hugging Face model (gpt2 or llama) built offline in the preset's shape, or PATH: a "
                        "checkpoint folder (config.json, model.safetensors) loaded offline, instead of scalekit's GPT "
                        "(needs transformers)")
    names = "; a generation model's name (ladder inference, tune --generate): shakespeare-char or a preset" \
        if generation else ""
    _own_model_option(p, names)
    p.add_argument("--loss-fn", default=None, metavar="PKG.MODULE:FN",
                   help="with --model: your loss_fn(model, batch) -> a scalar loss (a Transformers model: its own)")
    p.add_argument("--batch-fn", default=None, metavar="PKG.MODULE:FN",
                   help="with --model: your batch_fn(batch_size, device) -> a batch for the loss (a Transformers "
                        "model: the shipped corpus)")


def _own_model_option(p: argparse.ArgumentParser, also: str) -> None:
    p.add_argument("--model", default=None, metavar="PKG.MODULE:FACTORY",
                   help=f"your own model: a function (or class) in your package returning an nn.Module, imported as "
                        f"`python -m` finds modules (the current directory first); a Transformers model it returns "
                        f"runs as one{also}")


def _hf_model_option(p: argparse.ArgumentParser, help: str) -> None:  # noqa: A002 - argparse's own word
    p.add_argument("--hf-model", default=None, metavar="FAMILY|PATH", help=help)


# the GenerateConfig fields a ladder's generation (ladder inference, tune --generate) takes as flags of its own;
# the fields both configs have (seed, device, ...) and --hf-model are the run options', --batch-size copies the prompt
LADDER_GENERATE_FIELDS = ("max_new_tokens", "quality_seq_len")


def _generate_options(p: argparse.ArgumentParser, ladder: bool = False) -> None:
    """Options of `scalekit generate`; the inference ladder takes some of them (the training ladder ignores them)."""
    what = "inference ladder: " if ladder else ""
    p.add_argument("--prompt", action="append", default=None, metavar="TEXT", dest="prompts",
                   help=f"{what}a prompt (repeatable: a batch of prompts; default 'ROMEO:')")
    if ladder:  # --model is the run options' (a name, or your package's model)
        add_field_flags(p, GenerateConfig, LADDER_GENERATE_FIELDS, help_prefix=what)
        return
    p.add_argument("--model", default=None, help="shakespeare-char (the shipped model, default), a preset name for "
                                                 "random weights, or your own model: package.module:factory, a "
                                                 "function in your package returning an nn.Module")
    _hf_model_option(p, "a Hugging Face model (gpt2 or llama) built offline with random weights in the shape of "
                        "--model's preset (default: this machine's), or PATH: a checkpoint folder loaded offline, its "
                        "prompts read with the folder's tokenizer, instead of scalekit's GPT (needs transformers)")
    add_field_flags(p, GenerateConfig)


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
    predict_command.add_parser(sub)
    predict_command.add_plan_parser(sub)
    sub.add_parser("doctor", help="device facts, peak FLOP/s for MFU, what works here")
    tog = sub.add_parser("toggles", help="list every toggle with its summary and cost; NAME: its explainer and code")
    tog.add_argument("name", nargs="?", default=None, metavar="NAME",
                     help=f"one toggle: its explainer and the code it runs ({', '.join(TOGGLES)})")
    tog.add_argument("--hf-model", default=None, metavar="FAMILY|PATH",
                     help="what applies to a Hugging Face model (gpt2 or llama, built offline, or PATH: a checkpoint "
                          "folder): every toggle for training and generation, with the reason")
    _own_model_option(tog, ": what applies to it")
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
    _run_options(lad, generation=True)
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
    _run_options(tune, generation=True)
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


def flag_names(message: str) -> str:
    """A RunConfig error with the command-line flag it is about: '... (flag: --steps)'."""
    flags = []
    for cls in (RunConfig, GenerateConfig):
        known = flags_of(cls)
        for name in dict.fromkeys(re.findall(rf"{cls.__name__}\.(\w+)", message)):
            flags += [flag for flag in known.get(name, ()) if flag not in flags]
    return f"{message} (flag: {', '.join(flags)})" if flags else message
