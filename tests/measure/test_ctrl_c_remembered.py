"""A Ctrl-C whose KeyboardInterrupt is swallowed on the way still stops the run.

Python raises KeyboardInterrupt wherever the main thread is when SIGINT arrives.  Inside a finalizer (`__del__`,
run by the garbage collector between any two bytecodes) it is reported as "ignored" and lost, and a run would
have gone on for all its steps (a fresh suite on a busy machine saw exactly that: still running 60 s after Ctrl-C).
The run remembers SIGINT too, and stops at the next step."""

from __future__ import annotations

import subprocess
import sys
import textwrap

SWALLOWED_CTRL_C = textwrap.dedent("""
    import gc, os, signal, time
    from scalekit import RunConfig, run

    signal.signal(signal.SIGINT, signal.default_int_handler)  # Python's own: as in a script or a notebook cell

    class SignalsWhileFinalized:
        def __del__(self):  # Ctrl-C lands while a finalizer runs: its KeyboardInterrupt is "ignored"
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)

    def on_step(record):
        if record.step == 4:
            SignalsWhileFinalized()
            gc.collect()
            print("SENT", flush=True)

    cfg = RunConfig(preset="tiny", device="cpu", data="synthetic", steps=400, warmup_steps=1, log_every=1,
                    measure_memory=False)
    result = run(cfg, on_step=on_step)
    print("STATUS", result.status, len(result.steps), "; ".join(result.notes), flush=True)
""")


def test_a_ctrl_c_lost_in_a_finalizer_still_stops_the_run_at_the_next_step():
    proc = subprocess.run([sys.executable, "-c", SWALLOWED_CTRL_C], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "SENT" in proc.stdout and "KeyboardInterrupt" in proc.stderr  # Python said it ignored one
    status = next(line for line in proc.stdout.splitlines() if line.startswith("STATUS")).split()
    assert status[1] == "stopped" and int(status[2]) < 10, proc.stdout  # of 401 steps: stopped at the next one
    assert "interrupted (Ctrl-C)" in proc.stdout
