"""Compiled FlexAttention does not recompile when the recipe redraws frames-per-chunk and window each step.

The block mask is rebuilt every micro-batch from tensors (ids, and the window as a 0-d tensor), so the
compiled flex_attention sees the same graph inputs: 50 forward steps with 4 chunk sizes and dozens of windows
compile once. Control: the same kernel with the window as a Python int compiles once per window value
(two values, two graphs).
(CPU: compiled flex forward only; torch 2.13 has no CPU flex backward.)
Compiles go into the machine's Inductor cache for tests (tests/conftest.py run_inductor_cache); the claims
are Dynamo's graph counts and flex against sdpa, whatever the cache holds.
"""

import pytest
import torch
from torch._dynamo.utils import counters

from tests.support.lingbot_tiny import micro_batch, tiny_cfg
from trainer.model import WorldModel
from trainer.model.attention import make_backend
from trainer.model.masks import SequenceShape, lingbot_mask_mod, token_layout

pytestmark = [pytest.mark.heavy, pytest.mark.usefixtures("run_inductor_cache")]

STEPS = 50


@pytest.mark.timeout(600)
def test_fifty_steps_with_redrawn_chunk_and_window_compile_once():
    torch._dynamo.reset()
    counters.clear()
    cfg = tiny_cfg()
    torch.manual_seed(0)
    model = WorldModel(cfg)
    model.set_attention_backend("flex", compiled=True)
    chunks, windows, graphs = set(), set(), []
    with torch.no_grad():
        for step in range(STEPS):
            batch = micro_batch(cfg, seed=step)
            chunks.add(int(batch["frames_per_chunk"]))
            windows.add(int(batch["window"]))
            model(batch)
            graphs.append(counters["stats"]["unique_graphs"])
        flex = model.predict(batch)["video_tokens"]
    assert chunks == {1, 2, 3, 4} and len(windows) > 20
    assert graphs[0] == 1 and graphs[-1] == 1, graphs
    model.set_attention_backend("sdpa")
    with torch.no_grad():
        torch.testing.assert_close(flex, model.predict(batch)["video_tokens"], rtol=1e-4, atol=1e-5)


def test_control_a_python_int_window_recompiles_per_value():
    torch._dynamo.reset()
    counters.clear()
    backend = make_backend("flex", 32, compiled=True)
    shape = SequenceShape(frames=4, tokens_per_frame=8, actions_per_frame=3)
    q = torch.randn(1, 2, 192, 8)
    for window in (4, 5):
        layout = token_layout(shape, 2, 2, 32)
        backend.attend(q, q, q, backend.build_mask(lingbot_mask_mod(layout, window), layout.length, "cpu"))
    assert counters["stats"]["unique_graphs"] == 2
