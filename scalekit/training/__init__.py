"""Training: one measured run of a model's training steps, from its config to its result; the mirror of
scalekit.inference for generation.

`config` (RunConfig) → `build` (the model, data and optimizer made fresh, toggles applied phase by phase) →
`engine` (the measured loop: `scalekit.run`) → `results` (RunResult) and `report` (its table); `evaluation`
measures held-out loss during a run, `ladder` switches optimizations on one by one.  The studies built on runs
live here too: `finetune`, `batch_finder`, `qat_quality`, `profiling`.  This file imports nothing, so a low layer
may import `scalekit.training.results` without pulling in the loop."""
