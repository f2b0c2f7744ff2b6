"""Many processes, one run: `runtime` joins the process group and gives this rank its slice of each batch and
the job's figures (what every rank counted, said so); `sharding` is what the distributed toggles (fsdp, zero,
tensor_parallel, pipeline_parallel) share: meshes, FSDP2's options, ZeRO-1's optimizer; `timeline` records when
each pipeline stage ran each micro-batch's forward and backward.  Starting the
processes is scalekit.launch's job; nothing here imports a toggle or the launcher."""
