"""`scalekit` on the command line: `main` runs the subcommands (ladder, bench, plan, export, doctor, toggles,
launch, generate), `parser` declares them, and `fields` derives each config field's flag, default and help from
the config dataclasses.  `python -m scalekit.cli` is the console script."""
