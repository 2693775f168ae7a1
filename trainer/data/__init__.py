"""Data path: FurnitureBench .pkl episodes -> latents (cached) -> deterministic micro-batches.

The names below are imported on first use (PEP 562): the launcher reads episode lists and formats from
the submodules (sources, location, multiroot, lerobot) without importing torch, which only the stream
(stream.py, encoder.py) needs.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainer.data.furniturebench import DatasetError
    from trainer.data.stream import BATCH_KEYS, BatchStream, build_stream

_HOME = {
    "BATCH_KEYS": "trainer.data.stream",
    "BatchStream": "trainer.data.stream",
    "build_stream": "trainer.data.stream",
    "DatasetError": "trainer.data.furniturebench",
}

__all__ = ["BATCH_KEYS", "BatchStream", "DatasetError", "build_stream"]


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module 'trainer.data' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value
