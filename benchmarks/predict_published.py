"""Predictions against published runs, with one set of efficiency factors for every row (cost.PUBLISHED, set from
public microbenchmark figures, each with its source; none tuned to a row here): the rows and their sources are
scalekit/predict/published.py's (chapter 14 shows the same table); this writes them, with each public shape's
parameter count checked against transformers' model of the same config, to reference/.

    python benchmarks/predict_published.py [--out reference/predict_published.txt]
"""

from __future__ import annotations

import argparse
import datetime
import sys

from scalekit.predict import PUBLISHED
from scalekit.predict.published import sources, table
from scalekit.predict.shapes import shape_of


def shape_checks(names=("gpt2-124m", "llama3-8b", "llama2-7b", "qwen2-7b", "mistral-7b")) -> list[str]:
    """Each public shape's parameter count against the transformers model its config builds on the meta device
    (offline: no hub, no weights)."""
    import torch

    from scalekit.predict.shapes import hf_config

    transformers = __import__("transformers")
    lines = []
    for name in names:
        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(hf_config(name))
        counted = sum(p.numel() for p in model.parameters())
        lines.append(f"# shape {name}: {shape_of(name).n_params:,} parameters predicted, {counted:,} in transformers' "
                     f"model built from the same config on the meta device")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    lines = [f"# predict against published runs: {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC",
             "# command: python benchmarks/predict_published.py (no GPU: the figures are predictions from the parts "
             "table and one set of efficiency factors)",
             *(f"# factor {k}: {v}" for k, v in PUBLISHED.sources.items()),
             "# the 500 W H100's rows are intervals: predicted at the NVL's peaks (low) and at the SXM's (high)",
             table()]
    lines += shape_checks()
    lines += ["# sources:", *(f"#   {s}" for s in sources())]
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
