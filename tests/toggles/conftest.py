"""Fixtures the toggles' test files share."""

from __future__ import annotations

import warnings

import pytest

import scalekit.data.pipeline as pipeline
import scalekit.data.raw as raw
from scalekit.toggles import TOGGLES
from tests.helpers import COPY_TOGGLES


@pytest.fixture
def spies(monkeypatch):
    """Pretend the copy toggles are available here, and record what the DataLoader and the copies were asked."""
    for name in COPY_TOGGLES:
        monkeypatch.setattr(TOGGLES[name], "available", lambda hw: (True, ""))
    seen = {"loader_kwargs": [], "non_blocking": []}

    class RecordingLoader(raw.DataLoader):
        def __init__(self, *args, **kwargs):
            seen["loader_kwargs"].append(kwargs)
            super().__init__(*args, **kwargs)

    copy = pipeline.to_device

    def recording_copy(batch, device, non_blocking=False):
        seen["non_blocking"].append(non_blocking)
        return copy(batch, device, non_blocking)

    monkeypatch.setattr(raw, "DataLoader", RecordingLoader)
    monkeypatch.setattr(pipeline, "to_device", recording_copy)
    with warnings.catch_warnings():  # torch's "no accelerator is found, pinned memory won't be used"
        warnings.filterwarnings("ignore", message=".*pin_memory.*no accelerator", category=UserWarning)
        yield seen
