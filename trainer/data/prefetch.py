"""The batch off the critical path: a background thread prepares the next micro-batch while this one trains.

    stream = Prefetcher(build_stream(cfg, rank, world), cfg.train.grad_accum, pin=device.type == "cuda")
    batch = stream.micro_batch(step, micro)   # the same tensors the wrapped stream returns, bitwise
    stream.close()                            # at the end of the loop (joins the thread)

train.data_path (config/perf.py): auto = prefetch on CUDA, inline on CPU. Batches are a pure function of
(seed, step, micro, rank) (trainer/data/stream.py), so preparing one early changes nothing: after
returning (step, micro) the thread starts on the next key, (step, micro + 1) or (step + 1, 0). A request
for any other key (a resume, a step after a skipped one) is prepared inline and the guess is dropped, so
the batches are those of the inline path whatever the order of requests (tests/test_prefetch.py). With
`pin` the batch is copied into pinned host memory in the thread, so the loop's `.to(device,
non_blocking=True)` is a real asynchronous copy. Everything else (val_clips, data_summary, ...) is the
wrapped stream's.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch

Key = tuple[int, int]


class Prefetcher:
    def __init__(self, stream: Any, grad_accum: int, pin: bool = False):
        self.stream, self.grad_accum, self.pin = stream, grad_accum, pin
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="lingbot-prefetch")
        self._pending: tuple[Key, Future] | None = None
        self.hits = self.misses = 0  # prepared ahead / prepared inline (a resume, an unexpected key)

    def __getattr__(self, name: str) -> Any:  # the wrapped stream's other attributes and methods
        if name == "stream":
            raise AttributeError(name)
        return getattr(self.stream, name)

    def _prepare(self, step: int, micro: int) -> dict[str, torch.Tensor]:
        batch = self.stream.micro_batch(step, micro)
        if self.pin:
            batch = {k: v.pin_memory() for k, v in batch.items()}
        return batch

    def next_key(self, step: int, micro: int) -> Key:
        return (step, micro + 1) if micro + 1 < self.grad_accum else (step + 1, 0)

    def micro_batch(self, step: int, micro: int) -> dict[str, torch.Tensor]:
        pending, self._pending = self._pending, None
        if pending is not None and pending[0] == (step, micro):
            batch = pending[1].result()  # an error in the thread is raised here, in the loop
            self.hits += 1
        else:
            if pending is not None:
                pending[1].cancel()
            batch = self._prepare(step, micro)
            self.misses += 1
        key = self.next_key(step, micro)
        self._pending = (key, self._pool.submit(self._prepare, *key))
        return batch

    def close(self) -> None:
        """Drop the guess and join the thread (idempotent)."""
        if self._pending is not None:
            self._pending[1].cancel()
            self._pending = None
        self._pool.shutdown(wait=True, cancel_futures=True)
