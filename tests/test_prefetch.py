"""train.data_path=prefetch: the background thread's micro-batches are bitwise the inline stream's, same
seed and order, for a fresh run and for one resumed at a later step; an error in the thread reaches the
loop. The stream is the real one (trainer/data/stream.py on a generated FurnitureBench dataset)."""

from __future__ import annotations

import pytest
import torch

from tests.test_data import small_cfg
from trainer.config.perf import prefetch_data
from trainer.data.formats import generate as generate_mod
from trainer.data.prefetch import Prefetcher
from trainer.data.stream import build_stream

pytestmark = pytest.mark.fast


@pytest.fixture(scope="module")
def stream(tmp_path_factory):
    root = tmp_path_factory.mktemp("fb") / "furniture_train"
    generate_mod.generate_dataset(root, 6, 24, "one_leg", seed=0)
    return build_stream(small_cfg(root), 0, 1)


def _walk(source, first_step: int, last_step: int, grad_accum: int) -> list[dict]:
    return [source.micro_batch(s, m) for s in range(first_step, last_step + 1) for m in range(grad_accum)]


def _same(a: list[dict], b: list[dict]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert x.keys() == y.keys()
        for key in x:
            assert x[key].dtype == y[key].dtype and torch.equal(x[key], y[key]), key


def test_prefetched_batches_are_the_inline_ones_fresh_and_resumed(stream):
    accum = stream.grad_accum
    inline = _walk(stream, 1, 4, accum)
    fetched = Prefetcher(stream, accum)
    try:
        _same(_walk(fetched, 1, 4, accum), inline)
        assert fetched.misses == 1 and fetched.hits == 4 * accum - 1  # all but the first came ahead
    finally:
        fetched.close()
    resumed = Prefetcher(stream, accum)  # a resume from the checkpoint of step 2: steps 3, 4
    try:
        _same(_walk(resumed, 3, 4, accum), inline[2 * accum :])
        _same([resumed.micro_batch(1, 0)], inline[:1])  # an unexpected key: prepared inline, same batch
        assert resumed.val_clips() == stream.val_clips()  # the wrapped stream's other methods
    finally:
        resumed.close()


def test_an_error_in_the_thread_reaches_the_loop():
    class Failing:
        def micro_batch(self, step, micro):
            if (step, micro) == (1, 1):
                raise OSError("disk gone")
            return {"x": torch.tensor([step, micro])}

    fetched = Prefetcher(Failing(), 2)
    try:
        assert torch.equal(fetched.micro_batch(1, 0)["x"], torch.tensor([1, 0]))
        with pytest.raises(OSError, match="disk gone"):
            fetched.micro_batch(1, 1)
    finally:
        fetched.close()


def test_auto_is_inline_until_a_gpu_measures_prefetch(stream):
    cfg = small_cfg("unused")
    assert not prefetch_data(cfg, torch.device("cuda")) and not prefetch_data(cfg, torch.device("cpu"))
    cfg.train.data_path = "prefetch"
    assert prefetch_data(cfg, torch.device("cpu"))
