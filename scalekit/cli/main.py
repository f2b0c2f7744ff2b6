"""`scalekit` on the command line: ladder, bench, plan, export, doctor, toggles, launch."""

from __future__ import annotations

import errno
import gc
import json
import math
import os
import signal
import sys

from ..comparison.repeats import check_repeats
from ..errors import ConfigError
from ..files import STDOUT, check_writable, save_text
from ..hf.family_of import model_adapter
from ..launch import commands as launch_commands
from ..models.import_spec import imported_function, imported_model
from ..predict import command as predict_command
from ..toggles import TOGGLES
from ..training.config import PRESET_NAMES, RunConfig
from ..training.ladder import LADDERS, TABLE_THROUGHPUT
from .fields import changed_flags, derived_fields, field_flags, given_fields
from .parser import LADDER_GENERATE_FIELDS, flag_names, parser
from .stopping import STOPPABLE, StopRequest, catch_stop_signals, signal_name


def _progress(message: str) -> None:
    try:
        print(f"  · {message}", file=sys.stderr, flush=True)
    except OSError:  # stderr piped into something that closed, or a closed terminal: the run goes on unheard
        pass


def _report_stream(args):
    """Where tables and texts go: standard output, unless --json - puts the JSON there (then standard error)."""
    return sys.stderr if getattr(args, "json", None) == STDOUT else sys.stdout


def _save_json(json_path, doc) -> bool:
    """Write the --json results; if the write fails, say so in one line naming the path and where a copy went
    (standard output when no copy could be written).  False when they did not reach `json_path`."""
    if json_path is None:
        return True
    text = json.dumps(doc, indent=2, default=str)
    saved = save_text(json_path, text + "\n", "--json")
    if not saved.ok:
        print(f"scalekit: error: {saved.message}", file=sys.stderr)
        if saved.kept is None:
            print(text)
    return saved.ok


def _toggles(args) -> dict:
    """The --toggle flags as {name: value}; a toggle given twice is refused (the last would win unsaid)."""
    chosen: dict = {}
    for name, value in args.toggle:
        if name in chosen:
            said = [f"{name}={v}" if v is not True else name for v in (chosen[name], value)]
            raise ConfigError(f"--toggle {name} is given twice ({said[0]} and {said[1]}): give each toggle once")
        chosen[name] = value
    return chosen


def _generate_config(args, toggles, ladder: bool = False):
    from ..inference import GenerateConfig

    if ladder:  # the ladder's shared run options: only preset (as the model), batch and those of both configs apply
        shared = tuple(n for n in derived_fields(RunConfig) if n in derived_fields(GenerateConfig))
        unused = changed_flags(args, RunConfig, tuple(n for n in derived_fields(RunConfig)
                                                      if n not in ("preset", "batch_size", *shared)))
        if unused:
            what = "tune --generate" if getattr(args, "generate", False) else "ladder inference"
            takes = [spec.flag for spec in field_flags(GenerateConfig, (*LADDER_GENERATE_FIELDS, *shared))]
            raise ConfigError(f"scalekit {what}: {', '.join(unused)} set how training is measured; generation "
                              f"takes --prompt, --model, --hf-model, --preset (as the model), --batch-size (copies "
                              f"of the prompt), {', '.join(takes)}")
        own = [f"--{n.replace('_', '-')}" for n in ("loss_fn", "batch_fn") if getattr(args, n) is not None]
        if own:
            raise ConfigError(f"scalekit {'tune --generate' if getattr(args, 'generate', False) else 'ladder inference'}"
                              f": {', '.join(own)} train your model; generation takes --model alone")
        model = _own_model(args) or _hf_model(args) or args.model or \
            ("shakespeare-char" if args.preset == "auto" else args.preset)
        _check_generation_flags(args, model)
        prompts = args.prompts or ["ROMEO:"] * (args.batch_size or 1)
        given = given_fields(args, GenerateConfig, (*shared, *LADDER_GENERATE_FIELDS))
        return GenerateConfig(model=model, prompts=prompts, toggles=toggles, **given)
    if args.hf_model is not None:
        args.preset = args.model if args.model in PRESET_NAMES else "auto"
    model = _own_model(args) or _hf_model(args) or args.model or "shakespeare-char"
    prompts = args.prompts or ["ROMEO:"]
    return GenerateConfig(model=model, prompts=prompts, toggles=toggles, **given_fields(args, GenerateConfig))


def _check_generation_flags(args, model: str) -> None:
    """The training flags a generation reads: --preset (as the model, without --model) and --batch-size (copies
    of the prompt), refused here in their own names."""
    from ..inference.config import MAX_PROMPTS, MODEL_NAMES

    if args.model is None and isinstance(model, str) and model not in MODEL_NAMES:
        raise ConfigError(f"--preset {model!r} is the model generation uses without --model: allowed here: "
                          f"{', '.join(MODEL_NAMES)}")
    if args.batch_size is not None and not 1 <= args.batch_size <= MAX_PROMPTS:
        raise ConfigError(f"--batch-size is the copies of the prompt generated at once: 1 to {MAX_PROMPTS}, "
                          f"got {args.batch_size}")


def _config(args, toggles) -> RunConfig:
    own, functions = _own_model(args), _own_functions(args)
    if own is not None and model_adapter(own) is None and len(functions) < 2:  # a plain nn.Module: said by flag
        missing = " and ".join(f"--{n.replace('_', '-')}" for n in ("loss_fn", "batch_fn") if n not in functions)
        raise ConfigError(f"--model {args.model} builds your own nn.Module, which trains with {missing} too "
                          f"(package.module:name); a Transformers model needs neither")
    return RunConfig(toggles=toggles, model=own or _hf_model(args), **functions, **given_fields(args, RunConfig))


# -- --model, --loss-fn, --batch-fn: code of your own, named package.module:name (scalekit.models.import_spec) --
GENERATION_NAMES = ("ladder", "tune", "generate")  # where --model also takes a generation model's name


def _own_model(args):
    """--model package.module:factory: your package's model (a name without a colon is generation's, where the
    command generates: --model tiny)."""
    spec = getattr(args, "model", None)
    if spec is None or (":" not in spec and args.command in GENERATION_NAMES):
        return None
    if args.hf_model is not None:
        raise ConfigError(f"--model {spec} and --hf-model {args.hf_model} both name the model: give one")
    return imported_model(spec, "--model")


def _own_functions(args) -> dict:
    """--loss-fn and --batch-fn: {"loss_fn": ..., "batch_fn": ...} of those given, imported."""
    return {name: imported_function(getattr(args, name), f"--{name.replace('_', '-')}")
            for name in ("loss_fn", "batch_fn") if getattr(args, name, None) is not None}


def _hf_model(args):
    """--hf-model FAMILY: scalekit.hf.causal_lm(FAMILY) in the shape of --preset (auto: this machine's default);
    --hf-model PATH: the checkpoint folder at PATH, loaded offline (scalekit.hf.checkpoint_folder)."""
    if args.hf_model is None:
        return None
    from ..hf import FAMILIES, causal_lm
    from ..hf.checkpoint_folder import checkpoint_model, looks_like_path
    from ..machine.hardware import detect

    if looks_like_path(args.hf_model):
        return checkpoint_model(args.hf_model, "--hf-model")

    if args.hf_model not in FAMILIES:  # said before transformers is imported
        raise ConfigError(f"--hf-model: unknown family {args.hf_model!r}; allowed: {', '.join(FAMILIES)}, or the "
                          f"path of a checkpoint folder (./my-model)")

    preset = RunConfig(preset=args.preset).resolve(detect(args.device)).preset if args.preset == "auto" else args.preset
    return causal_lm(args.hf_model, preset=preset)


def main(argv: list[str] | None = None) -> int:
    try:
        args = parser().parse_args(argv)
    except SystemExit as exc:  # a refused flag (said in one line), or --help
        return exc.code if isinstance(exc.code, int) else 2
    stop = StopRequest()
    previous = catch_stop_signals(stop, args.command in STOPPABLE, lambda line: _progress(line))
    try:
        code = COMMANDS[args.command](args, stop)
        sys.stdout.flush()  # here, not at exit: a closed pipe is met where it can be handled
        return code if stop.signum is None else 128 + stop.signum  # as a shell reports a command a signal ended
    except BrokenPipeError:  # `scalekit toggles | head -3`: the reader has what it wanted
        _discard_stdout()
        return 141  # 128 + SIGPIPE, as a tool killed by the closed pipe would end
    except ConfigError as exc:
        _say(f"scalekit: error: {flag_names(str(exc))}")
        return 2
    except KeyboardInterrupt as exc:  # a second signal, or a command with no step to finish first
        signum = getattr(exc, "signum", signal.SIGINT)
        _say("scalekit: interrupted" if signum == signal.SIGINT else f"scalekit: stopped by {signal_name(signum)}")
        return 128 + signum
    except OSError as exc:
        if exc.errno != errno.EIO or stop.signum is None:
            raise
        _discard_stdout()  # SIGHUP from a closed terminal: nothing can be shown any more, the --json is written
        return 128 + stop.signum
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _say(line: str) -> None:
    """One line on standard error, which may be gone (a closed terminal, a closed pipe)."""
    try:
        print(line, file=sys.stderr, flush=True)
    except OSError:
        pass


def _discard_stdout() -> None:
    """Point standard output at /dev/null, so the interpreter's last flush at exit does not fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # no real file behind stdout (a test's capture)
        pass


def cmd_ladder(args, stop) -> int:
    from ..training.report import results_table

    base = _config(args, {}) if args.kind != "inference" else _generate_config(args, {}, ladder=True)
    json_path = check_writable(args.json, "--json") if args.json else None  # before the ladder's minutes of work
    check_repeats("--repeats", args.repeats)
    results = LADDERS[args.kind](base, on_status=_progress,
                                 on_result=lambda r: _progress(f"done: {r.label} ({r.status})"), stop=stop,
                                 repeats=args.repeats)
    saved = _save_json(json_path, [r.to_dict() for r in results])  # first: a closed stdout cannot lose them
    if args.kind == "inference":
        from ..inference.report import generation_table  # generations have their own table

        print(generation_table(results), file=_report_stream(args))
    else:
        print(results_table(results, TABLE_THROUGHPUT.get(args.kind, "median")), file=_report_stream(args))
    return 0 if saved and all(r.status in ("ok", "skipped") for r in results) else 1


def cmd_bench(args, stop) -> int:
    from ..training.engine import run
    from ..training.report import results_table

    cfg = _config(args, _toggles(args))
    json_path = check_writable(args.json, "--json") if args.json else None
    nprocs = launch_commands.check_nproc_flag(args.nproc_per_node, default="this process alone")
    timeout_s = launch_commands.check_timeout_flag(args.timeout_s)
    if nprocs:
        cfg.check_ranks(nprocs)  # before "launching": a mesh the ranks cannot form starts none of them
        from torch.distributed.elastic.multiprocessing.api import SignalException

        from ..launch import launch_run

        _progress(f"launching {nprocs} processes")
        stop.at_once = True
        try:
            with launch_commands.ctrl_c_raises():
                result = launch_run(cfg, nprocs=nprocs, catch_errors=True, timeout_s=timeout_s)
        except (KeyboardInterrupt, SignalException) as exc:
            return _launch_stopped(exc)
    elif timeout_s is not None:
        raise ConfigError("--timeout-s limits launched processes: use it with --nproc-per-node N")
    else:
        first = os.environ.get("RANK", "0") == "0"  # under torchrun every rank runs this: one reports
        result = run(cfg, on_status=_progress if first else None, stop=stop, catch_errors=True)
        if not first:
            return 0 if result.status == "ok" else 1
    saved = _save_json(json_path, result.to_dict())
    print(results_table([result]), file=_report_stream(args))
    return 0 if saved and result.status == "ok" else 1


def _launch_stopped(exc: BaseException) -> int:
    """A launched bench ended by a signal (the launcher stopped every rank): one line, and 128 + the signal."""
    signum = int(getattr(exc, "sigval", None) or getattr(exc, "signum", signal.SIGINT))
    if signum == signal.SIGINT:
        return launch_commands.interrupted("scalekit bench")
    _say(f"scalekit bench: stopped by {signal_name(signum)}; every rank was stopped")
    return 128 + signum


def cmd_generate(args, stop) -> int:
    from ..inference import generate
    from ..inference.report import generation_table

    cfg = _generate_config(args, _toggles(args))
    json_path = check_writable(args.json, "--json") if args.json else None
    result = generate(cfg, on_status=_progress, stop=stop, catch_errors=True)
    saved = _save_json(json_path, result.to_dict())
    out = _report_stream(args)
    for text in result.texts:
        print(text, file=out)
        print("-" * 78, file=out)
    print(generation_table([result]), file=out)
    return 0 if saved and result.status == "ok" else 1


def cmd_launch(args, stop) -> int:
    return launch_commands.run_command(args)


def cmd_plan(args, stop) -> int:
    from ..plan import estimate

    device = None if args.device == "auto" else args.device  # a GPU can be planned for without one
    e = estimate(_config(args, _toggles(args)), device=device)
    for part, n in e.memory_breakdown().items():
        print(f"{part:16} {n / 2**20:10.1f} MiB")
    print(f"{'FLOPs/step':16} {e.flops_per_step:10.3g} (with recomputation {e.hardware_flops_per_step:.3g})")
    for note in e.notes:
        print(f"note: {note}")
    return 0


def cmd_export(args, stop) -> int:
    from ..hf.export import export_code

    if args.world_size < 1:
        raise ConfigError(f"--world-size must be a positive number of processes, got {args.world_size}")
    print(export_code(_config(args, _toggles(args)), args.target, world_size=args.world_size), end="")
    return 0


def cmd_doctor(args, stop) -> int:
    from ..machine.doctor import facts
    from ..measure.text_tables import facts_table

    _progress("checking torch.compile and bitsandbytes (a few seconds)")
    print(facts_table(facts()))
    return 0


def cmd_toggles(args, stop) -> int:
    from ..machine.hardware import detect
    from ..toggles import ORDER

    if args.hf_model is not None or args.model is not None:
        from ..comparison.applicable import applicable

        print(applicable(_own_model(args) or _hf_model(args), device=args.device))
        return 0
    hw = detect()  # this machine, as a run with device "auto" sees it
    if args.name is not None:
        if args.name not in TOGGLES:
            raise ConfigError(f"toggles: unknown toggle {args.name!r}; allowed: {', '.join(TOGGLES)}")
        print(toggle_page(TOGGLES[args.name], hw))
        return 0
    for t in ORDER:
        modes = f" [modes: {', '.join(map(str, t.choices))}]" if t.choices else ""
        where = "" if "train" in t.loops else \
            f" [generation: scalekit generate{'' if t.changes_weights else ', or a training run with eval_every'}]"
        here = "".join(f"\n{'':13} {line}" for line in availability(t, hw))
        print(f"{t.name:13} {t.summary}{modes}{where}\n{'':13} cost: {t.cost}\n{'':13} helps when: {t.helps_when}"
              f"{here}")
    return 0


def availability(t, hw) -> list[str]:
    """What stops toggle `t` (or some of its modes) on this machine, one line each; none when all of it runs."""
    ok, why = t.available(hw)
    if not ok:
        in_ranks, _ = t.available_in_ranks(hw)
        return [f"{'in one process' if in_ranks else 'unavailable here'}: {why}"]
    lines = []
    for choice in t.choices or ():
        ok, why = t.choice_available(hw, choice)
        if not ok:
            lines.append(f"unavailable here: {choice} — {why}")
    return lines


def toggle_page(t, hw=None) -> str:
    """What `scalekit toggles NAME` prints: the one-liners, where it runs, the explainer, and its code."""
    modes = f"modes: {', '.join(map(str, t.choices))} (first is the default)\n" if t.choices else ""
    here = "".join(f"{line}\n" for line in availability(t, hw)) if hw is not None else ""
    rule = "-" * 78
    return (f"{t.name}: {t.summary}\ncost: {t.cost}\nhelps when: {t.helps_when}\n{modes}"
            f"phase: {t.phase}; loops: {', '.join(t.loops)}\n{here}{rule}\n{t.explainer.strip()}\n{rule}\n"
            f"The code it runs (scalekit/toggles/{t.name}.py):\n\n{t.code()}")


def cmd_tune(args, stop) -> int:
    from ..autotune import autotune
    from ..errors import NothingFits

    cfg = _generate_config(args, _toggles(args), ladder=True) if args.generate else _config(args, _toggles(args))
    if args.generate and args.export:
        raise ConfigError("--export writes training code; with --generate there is none to write")
    json_path = check_writable(args.json, "--json") if args.json else None
    if args.budget_mb is not None and not 0 < args.budget_mb <= 2**40:  # nan fails both; 2**40 MiB: an exabyte
        raise ConfigError(f"--budget-mb must be a positive number of MiB (at most 2**40), got {args.budget_mb}")
    if not (math.isfinite(args.time_budget_s) and args.time_budget_s > 0):
        raise ConfigError(f"--time-budget-s must be a positive number of seconds, got {args.time_budget_s}")
    if args.run_steps < 1:
        raise ConfigError(f"--run-steps must be a positive whole number (the steps of the real run), "
                          f"got {args.run_steps}")
    budget = int(args.budget_mb * 2**20) if args.budget_mb is not None else None
    try:
        sizes = {} if args.generate else {"steps": cfg.steps, "warmup_steps": cfg.warmup_steps}
        result = autotune(cfg, budget_bytes=budget, time_budget_s=args.time_budget_s, run_steps=args.run_steps,
                          stop=stop, **sizes, on_note=lambda text: _progress(f"note: {text}"),
                          on_candidate=lambda c, s: _progress(f"{c.label}: {'kept' if c.accepted else 'not kept'}"
                                                              f" — {c.reason}"))
    except NothingFits as exc:
        print(f"scalekit tune: {exc}", file=sys.stderr)
        return 1
    saved = _save_json(json_path, result.to_dict())
    out = _report_stream(args)
    print(result.table().to_string(index=False), file=out)
    print(result.summary(), file=out)
    flags = " ".join(f"--toggle {n}" if v is True else f"--toggle {n}={v}" for n, v in result.best.toggles.items())
    print(f"best: {flags}" + ("" if args.generate else f" --batch-size {result.best.batch_size}"), file=out)
    if args.export:
        print(f"\n# the winner for {args.export}:\n{result.export(args.export)}", file=out)
    return 0 if saved else 1


COMMANDS = {"tune": cmd_tune, "ladder": cmd_ladder, "bench": cmd_bench, "launch": cmd_launch, "plan": cmd_plan,
            "doctor": cmd_doctor, "toggles": cmd_toggles, "generate": cmd_generate,
            "export": cmd_export, "predict": predict_command.run,
            "plan-for": predict_command.run_plan}


def program() -> int:
    """`scalekit` as a program (its console script, `python -m scalekit.cli`): `main()`, then a quick exit.

    A process that has imported torch spends 1-1.5 s at exit in the garbage collector's last passes over every
    object torch, transformers, plotly and pandas made (measured: 1.1-1.5 s, and 0.2 s with them frozen).  Frozen
    first, the passes skip them.  What an exit must still do happens as before: atexit handlers (weakref finalizers,
    worker processes, temporary folders), the standard streams' flush, and `__del__` of every object whose last
    reference goes; only cyclic garbage is left to the operating system, whose `__del__` CPython does not promise at
    exit either.  Not in `main()`: a caller's own process keeps its collector whole."""
    code = main()
    gc.freeze()
    return code


if __name__ == "__main__":
    sys.exit(program())
