"""What does the Lab's live view cost? The same config through `run()` and through the Lab, side by side.

The Lab runs `scalekit.run` in a background thread and redraws its plots, progress bar and status line
from a second thread at most `updates_per_s` times a second (less often after a costly redraw).
Two figures:

- view busy: the view thread's CPU time (time.thread_time) ÷ the run's wall time.  The view holds the
  GIL while it works, so this is about what it takes from the training thread (hand-offs add a little);
- side by side: the Lab's wall-clock tokens/s ÷ `run()`'s on the same config, alternating which goes
  first in each round so drift in the machine's speed hits both alike.  `run()` is called from a
  background thread as the Lab calls it: with 2 OpenMP threads on a loaded machine, torch in the main
  thread can be several times slower or faster than in a fresh thread, which has nothing to do with
  the view.  On a shared machine this ratio carries the machine's noise, which is why the view's own
  time is measured too.

By default it runs inside a Jupyter kernel (started here with jupyter_client), so every redraw really
goes out as widget messages; `--in-process` measures in this Python process, where the messages go
nowhere.  The last line is `overhead=<view busy as a fraction of run time>` plus the side-by-side ratio.

    python benchmarks/lab_overhead.py [--preset small] [--steps 300] [--rounds 3] [--threads N] [--in-process]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading

RESULT_TAG = "LAB_OVERHEAD_JSON "


def run_in_thread(run, cfg, hw):
    out = {}
    worker = threading.Thread(target=lambda: out.update(result=run(cfg, hw=hw)))
    worker.start()
    worker.join()
    return out["result"]


def measure(preset: str, steps: int, rounds: int, updates_per_s: float, threads: int | None = None) -> dict:
    import torch

    from scalekit import Lab, RunConfig, detect, run

    if threads:
        torch.set_num_threads(threads)
    hw = detect("auto")
    fields = dict(preset=preset, steps=steps, warmup_steps=5, measure_memory=False)
    lab = Lab(hw=hw, updates_per_s=updates_per_s, **fields)
    plain_cfg = RunConfig(batch_size=lab.default_batch_size, label="baseline", **fields)
    rows = []
    for k in range(rounds):
        order = ("run", "lab") if k % 2 == 0 else ("lab", "run")
        row = {}
        for who in order:
            if who == "run":  # in a thread of its own, as the Lab runs it
                row["run_tokens_per_s"] = run_in_thread(run, plain_cfg, hw).tokens_per_s_wall
            else:
                assert lab.start(), lab.message.value
                result = lab.wait()
                assert result.status == "ok", result.error
                cost = lab.view_costs[max(lab.view_costs)]
                row.update(lab_tokens_per_s=result.tokens_per_s_wall, view_busy=cost.fraction,
                           view_updates=cost.updates, run_wall_s=cost.run_wall_s,
                           median_step_ms=result.step_ms.median)
        row["ratio"] = row["lab_tokens_per_s"] / row["run_tokens_per_s"]
        rows.append(row)
    return {"device": hw.device_name, "preset": preset, "steps": steps, "updates_per_s": updates_per_s,
            "torch_threads": torch.get_num_threads(),
            "rounds": rows, "view_busy": statistics.median(r["view_busy"] for r in rows),
            "ratio": statistics.median(r["ratio"] for r in rows)}


def in_kernel(**kwargs) -> dict:
    """Run `measure` inside a fresh ipykernel, so widget updates are real comm messages."""
    from jupyter_client.manager import start_new_kernel

    km, kc = start_new_kernel(kernel_name="python3", cwd=os.getcwd())
    out: list[str] = []

    def hook(msg):
        if msg["msg_type"] == "stream":
            out.append(msg["content"]["text"])
        elif msg["msg_type"] == "error":
            out.append("\n".join(msg["content"]["traceback"]))

    code = (f"import json, runpy; res = runpy.run_path({os.path.abspath(__file__)!r})['measure'](**{kwargs!r}); "
            f"print({RESULT_TAG!r} + json.dumps(res), flush=True)")
    try:
        reply = kc.execute_interactive(code, output_hook=hook, timeout=3600)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    text = "".join(out)
    if reply["content"]["status"] != "ok" or RESULT_TAG not in text:
        raise RuntimeError(f"the benchmark failed in the kernel:\n{text[-3000:]}")
    return json.loads(text.split(RESULT_TAG, 1)[1].splitlines()[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="small")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--updates-per-s", type=float, default=4.0)
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    ap.add_argument("--in-process", action="store_true", help="measure here, not inside a Jupyter kernel")
    args = ap.parse_args()
    kwargs = dict(preset=args.preset, steps=args.steps, rounds=args.rounds, updates_per_s=args.updates_per_s,
                  threads=args.threads)
    if args.in_process:
        res, where = measure(**kwargs), "this process (messages go nowhere)"
    else:
        res, where = in_kernel(**kwargs), "a Jupyter kernel (real widget messages)"
    print(f"{res['preset']} on {res['device']} ({res['torch_threads']} torch threads), {res['steps']} steps, "
          f"view ≤ {res['updates_per_s']:g} redraws/s, measured in {where}")
    for k, r in enumerate(res["rounds"]):
        print(f"  round {k + 1}: step {r['median_step_ms']:.1f} ms median, run {r['run_wall_s']:.1f} s, "
              f"{r['view_updates']} redraws, view busy {r['view_busy']:.3%}; tokens/s wall run() "
              f"{r['run_tokens_per_s']:,.0f} vs Lab {r['lab_tokens_per_s']:,.0f} (ratio {r['ratio']:.3f})")
    print(f"overhead={res['view_busy']:.4f} (view busy {res['view_busy']:.2%} of run time); "
          f"side by side Lab/run() tokens/s ratio={res['ratio']:.3f}")


if __name__ == "__main__":
    main()
