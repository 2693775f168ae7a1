"""Data path: FurnitureBench .pkl episodes -> latents (cached) -> deterministic micro-batches."""

from trainer.data.furniturebench import DatasetError
from trainer.data.stream import BATCH_KEYS, BatchStream, build_stream

__all__ = ["BATCH_KEYS", "BatchStream", "DatasetError", "build_stream"]
