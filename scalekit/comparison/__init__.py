"""Choosing what to switch on: `compare` (the side-by-side table, `scalekit.compare`), `repeats` (rows measured
again in alternating rounds, so a quieter machine is not mistaken for a faster toggle) and `applicable` (every
toggle against your model, with the reason).  The ladders live with what they measure (scalekit.training.ladder,
scalekit.inference.ladder); the search over combinations is scalekit.autotune."""
