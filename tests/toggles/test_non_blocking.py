"""non_blocking: batches copied to the device asynchronously; alone, from pageable memory, it says it
changes nothing (through a pretend GPU on the CPU; tests/toggles/test_dataloader_pin_memory.py has the two
copy toggles together)."""

from __future__ import annotations

from tests.helpers import built, tiny

RAW = dict(data="shakespeare-raw", transform_rounds=1)  # through a DataLoader (spies: toggles/conftest.py)


def test_non_blocking_alone_says_it_changes_nothing_from_pageable_memory(spies):
    with built(tiny(**RAW, toggles=["non_blocking"])) as ctx:
        next(ctx.batches)
        assert any("non_blocking without pinned memory" in note for note in ctx.notes)
    assert spies["non_blocking"] == [True]
