"""What the command line prints: unavailable toggles marked with their reason, a closed pipe (`| head -3`) met
without a traceback, Ctrl-C during a compile said at once, and nothing but scalekit's own words on a run
that works."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import pytest

from scalekit.cli.main import main
from tests.helpers import REPO, library_lines, scalekit_env


# -- scalekit toggles: what is unavailable here, and why ------------------------------------------------------------
def listing(capsys, *argv) -> str:
    assert main(["toggles", *argv]) == 0
    return capsys.readouterr().out


def block(out: str, name: str) -> str:
    """The lines of one toggle in `scalekit toggles`: its first line and the indented ones below it."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:1] == [name])
    rest = lines[start + 1:]
    end = next((i for i, line in enumerate(rest) if line and not line.startswith(" ")), len(rest))
    return "\n".join([lines[start], *rest[:end]])


@pytest.mark.parametrize("name,words", [
    ("tf32", "unavailable here: "), ("dataloader_pin_memory", "unavailable here: "),
    ("non_blocking", "unavailable here: "), ("empty_cache_steps", "unavailable here: "),
    # the distributed toggles run on CPU ranks over gloo: alone they need ranks, not a GPU
    ("ddp", "in one process: "), ("deepspeed", "in one process: "),
])
def test_the_listing_marks_each_toggle_unavailable_on_a_cpu_with_its_reason(name, words, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("these toggles are unavailable on a CPU-only machine")
    text = block(listing(capsys), name)
    if words == "in one process: ":
        assert "unavailable here" not in text, text
    assert words in text, text
    reason = text.split(words, 1)[1]
    assert len(reason.strip()) > 10, text  # a reason, not a bare mark


def test_the_listing_marks_the_modes_unavailable_here(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("GPTQ and AWQ are unavailable on a CPU-only machine")
    text = block(listing(capsys), "quantize")
    for mode in ("gptq", "awq"):
        assert re.search(rf"unavailable here: {mode}\b.*CUDA", text), text
    assert "unavailable here: torch-dynamic-int8" not in text  # runs on this CPU


def test_an_available_toggle_is_not_marked(capsys):
    text = block(listing(capsys), "fused_adamw")
    assert "unavailable" not in text


def test_one_toggles_page_says_whether_it_runs_here(capsys):
    import torch

    page = listing(capsys, "tf32")
    if not torch.cuda.is_available():
        assert "unavailable here: " in page.split("-" * 78)[0]
    page = listing(capsys, "quantize")
    assert ("unavailable here: gptq" in page) == (not torch.cuda.is_available())


# -- a closed pipe ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("argv", [["toggles"], ["toggles", "compile"], ["export", "hf", "--toggle", "bf16"],
                                  ["plan", "--preset", "tiny", "--device", "cpu"]],
                         ids=["toggles", "toggles NAME", "export", "plan"])
def test_a_closed_pipe_ends_the_command_quietly(argv):
    proc = subprocess.Popen([sys.executable, "-m", "scalekit.cli.main", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=scalekit_env(), cwd=REPO)
    proc.stdout.close()  # as `| head -3` does once it has its lines: every write now meets a closed pipe
    err = proc.stderr.read().decode()
    proc.wait(60)
    assert "Traceback" not in err and "BrokenPipeError" not in err and "Exception ignored" not in err, err
    assert proc.returncode in (0, 141), (proc.returncode, err)


@pytest.mark.slow
def test_a_closed_pipe_after_a_bench_keeps_the_json_and_prints_no_traceback(tmp_path):
    out = tmp_path / "r.json"
    proc = subprocess.Popen([sys.executable, "-m", "scalekit.cli.main", "bench", "--preset", "tiny", "--device", "cpu",
                             "--steps", "2", "--warmup-steps", "0", "--json", str(out)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=scalekit_env(), cwd=REPO)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    proc.wait(120)
    assert "Traceback" not in err and out.exists(), err


def test_a_closed_stderr_does_not_end_a_run(monkeypatch, capsys):
    import scalekit.cli.main as cli

    def broken(*args, **kwargs):
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(cli, "print", broken, raising=False)  # _progress prints through print
    cli._progress("a line nobody can read")  # must not raise


# -- Ctrl-C during a compile ---------------------------------------------------------------------------------------
def frame_inside(module: str):
    """A frame whose caller chain runs through code of `module`, as a signal handler would receive it."""
    caught = {}
    namespace = {"__name__": module, "catch": lambda: caught.setdefault("frame", sys._getframe(1))}
    exec("def compile_step():\n    catch()\ncompile_step()", namespace)  # noqa: S102 - a frame of that module
    return caught["frame"]


@pytest.mark.parametrize("module", ["torch._dynamo.convert_frame", "torch._inductor.compile_fx"])
def test_ctrl_c_during_a_compile_says_at_once_that_the_stop_waits_for_it(module):
    from scalekit.cli.stopping import stop_message

    words = stop_message(frame_inside(module))
    assert "torch.compile" in words and "finishes compiling" in words and "Ctrl-C again" in words


def test_ctrl_c_between_compiled_steps_says_it_stops_after_the_step():
    from scalekit.cli.stopping import stop_message

    for module in ("torch._inductor.output_code", "torch._dynamo.eval_frame", "scalekit.training.engine"):  # a compiled step
        assert stop_message(frame_inside(module)).startswith("stopping after this step"), module


class SlowCompiler:
    """A torch.compile backend that takes `seconds` over its first graph (as a cold inductor compile takes
    tens of seconds), then runs the graph as it is; it says when it starts and when it is done."""

    def __init__(self, seconds: float):
        import threading

        self.seconds, self.started, self.done_at = seconds, threading.Event(), None

    def __call__(self, gm, example_inputs):
        if not self.started.is_set():
            self.started.set()
            time.sleep(self.seconds)  # a Ctrl-C now lands inside torch._dynamo.convert_frame
            self.done_at = time.monotonic()
        return gm.forward


@pytest.mark.parametrize("argv", [
    ["bench", "--preset", "tiny", "--device", "cpu", "--toggle", "compile", "--steps", "200", "--warmup-steps", "2"],
    ["generate", "--device", "cpu", "--toggle", "kv_cache=static", "--toggle", "compile", "--max-new-tokens", "200",
     "--no-quality"],
], ids=["bench", "generate"])
def test_ctrl_c_during_a_compile_is_said_at_once_and_stops_soon_after_it(argv, monkeypatch, capsys):
    import threading

    import torch

    compiler = SlowCompiler(3.0)
    real_compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda model, **kw: real_compile(model, backend=compiler))
    said = {}

    def press_ctrl_c():
        compiler.started.wait(60)
        time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGINT)
        said["at"] = time.monotonic()

    import scalekit.cli.main as cli

    heard = []
    progress = cli._progress
    monkeypatch.setattr(cli, "_progress", lambda message: (heard.append((time.monotonic(), message)),
                                                           progress(message)))
    threading.Thread(target=press_ctrl_c, daemon=True).start()
    code = main(argv)
    ended = time.monotonic()
    err = capsys.readouterr().err
    assert "finishes compiling" in err and "Ctrl-C again" in err, err
    told = next(t for t, message in heard if "finishes compiling" in message)
    assert told - said["at"] < 1 and told < compiler.done_at, err  # said at once, while the compile goes on
    assert ended - compiler.done_at < 5, err  # and stopped soon after the compile
    assert code == 130 and "stopped" in err and "Traceback" not in err  # 128 + SIGINT, as a shell expects


# -- nothing but scalekit's own words for a run that works ---------------------------------------------------------
def own_words_only(argv: list[str], timeout_s: float = 240) -> str:
    """Run `scalekit ARGV` in a fresh process; every line on stderr is scalekit's (progress, notes), and the
    output holds none of the lines libraries print; returns stdout + stderr."""
    proc = subprocess.run([sys.executable, "-m", "scalekit.cli.main", *argv], capture_output=True, text=True,
                          timeout=timeout_s, env=scalekit_env(), cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    foreign = library_lines(proc.stdout, proc.stderr)
    assert not foreign, "\n".join(foreign)
    return proc.stdout + proc.stderr


@pytest.mark.slow  # importing transformers takes most of it
def test_a_hugging_face_run_prints_only_scalekits_words():
    pytest.importorskip("transformers")
    own_words_only(["bench", "--hf-model", "gpt2", "--steps", "2", "--warmup-steps", "0", "--device", "cpu"])
    pytest.importorskip("peft")
    own_words_only(["bench", "--hf-model", "gpt2", "--steps", "2", "--warmup-steps", "0", "--device", "cpu",
                    "--toggle", "lora=4"])  # peft asks transformers a deprecated question


# (a compiled torchao generation, whose cold compile is where torchao and inductor speak, is held to the same words
# as the inference ladder's "+ int8" rung, in tests/cli/test_inference_cli.py's fresh process)
def test_a_generation_prints_only_scalekits_words():
    own_words_only(["generate", "--max-new-tokens", "2", "--warmup-tokens", "0", "--device", "cpu", "--no-quality"])
