"""Inference parity with the upstream LingBot-VA server (58c2ae5), from committed golden values.

tests/fixtures/inference_parity.{safetensors,json} hold a tiny transformer built and saved by the upstream
code, each case's inputs (prompt and empty-prompt embeddings, real latents and executed robot actions,
quantiles, the initial noise of every chunk) and the upstream's sampled latents, normalised actions and
robot-unit actions per chunk, recorded by tests/support/reference_inference.py driving its VA_Server as a
robot client does (docs/evaluation.md has the commands). Ours must match to 1e-4 for every chunk: case a
(video guidance 5 + action guidance 3: two rows with their own histories; window 4, so the third chunk
runs after the cache evicted the oldest history), case b (one row, video_exec_step 3).
"""

import json

import pytest
import torch

from tests.support.inference_golden import FIXTURE_JSON, FIXTURE_TENSORS, tiny_model
from tests.support.inference_run import compare, run_case

pytestmark = pytest.mark.fast
TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def fixture():
    from safetensors.torch import load_file

    if not FIXTURE_TENSORS.is_file():
        pytest.fail(f"{FIXTURE_TENSORS} is missing: see docs/evaluation.md 'Parity' to regenerate it")
    meta = json.loads(FIXTURE_JSON.read_text())
    tensors = load_file(FIXTURE_TENSORS)
    model = tiny_model(meta["config_json"], meta["actions_per_frame"], FIXTURE_JSON)
    weights = {k[len("weight.") :]: v for k, v in tensors.items() if k.startswith("weight.")}
    model.load_state_dict(weights, strict=True)
    return model, meta, tensors


@pytest.mark.parametrize("case", ["a", "b"])
def test_sampled_chunks_equal_the_upstream_server(fixture, case):
    model, meta, tensors = fixture
    diffs = compare(model, meta, tensors, case)
    assert len(diffs) == 3 * meta["cases"][case]["chunks"] >= 6  # latents, actions, robot units per chunk
    assert max(diffs.values()) < TOLERANCE, diffs


def test_the_golden_values_are_not_trivial(fixture):
    model, meta, tensors = fixture
    for key, value in tensors.items():
        if ".out." in key:
            assert value.abs().mean() > 0.1, key
    # window 4 in case a: the third chunk sees an evicted history; with a window that keeps everything
    # the first two chunks are unchanged and the third is not, so the golden values exercise eviction
    wide = json.loads(json.dumps(meta))
    wide["cases"]["a"]["window"] = 30
    ours = run_case(model, wide, tensors, "a")
    for k in (0, 1):
        torch.testing.assert_close(
            ours[f"chunk{k}.latents"], tensors[f"a.out.chunk{k}.latents"], atol=1e-4, rtol=0
        )
    assert (ours["chunk2.latents"] - tensors["a.out.chunk2.latents"]).abs().max() > 1e-3


def test_recomputed_history_gives_the_same_chunks(fixture):
    model, meta, tensors = fixture
    assert max(compare(model, meta, tensors, "b", kv_cache=False).values()) < TOLERANCE
