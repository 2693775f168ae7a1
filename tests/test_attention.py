"""flex and sdpa compute the same attention on the real LingBot mask; backend choice per device.

The compiled flex case compiles into the machine's Inductor cache for tests (tests/conftest.py
run_inductor_cache), not the host's default dir; flex against sdpa holds whatever the cache holds."""

import pytest
import torch

from trainer.config import RunConfig
from trainer.model.attention import (
    BackendUnavailable,
    FlexBackend,
    SdpaBackend,
    flex_backward_error,
    resolve_backend,
)
from trainer.model.masks import SequenceShape, dense_mask, lingbot_mask_mod, token_layout

pytestmark = pytest.mark.fast

SHAPE = SequenceShape(frames=4, tokens_per_frame=16, actions_per_frame=2)
BLOCK = 64


def _setup(batch=2, chunk=1, window=2, device="cpu", dtype=torch.float32, seed=0):
    layout = token_layout(SHAPE, batch, chunk, BLOCK, device)
    mask_mod = lingbot_mask_mod(layout, window)
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, 2, layout.length, 16, generator=g).to(device, dtype) for _ in range(3))
    return layout, mask_mod, q, k, v


def naive_attention(q, k, v, allowed):
    """Softmax over allowed keys, zero for rows with none (FlexAttention's convention), in float64."""
    q, k, v = q.double(), k.double(), v.double()
    scores = (q @ k.transpose(-1, -2)) / q.shape[-1] ** 0.5
    scores = scores.masked_fill(~allowed, float("-inf"))
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    return weights @ v


def test_layout_has_padding_and_several_samples():
    layout, *_ = _setup()
    assert layout.sections[-1] > 0 and layout.length % BLOCK == 0
    assert set(layout.seq_ids.tolist()) == {-1, 0, 1}


def test_sdpa_matches_naive_outputs_and_gradients():
    layout, mask_mod, q, k, v = _setup()
    allowed = dense_mask(mask_mod, layout.length)
    backend = SdpaBackend()
    mask = backend.build_mask(mask_mod, layout.length, "cpu")
    qs, ks, vs = (t.clone().requires_grad_() for t in (q, k, v))
    qn, kn, vn = (t.double().clone().requires_grad_() for t in (q, k, v))
    out = backend.attend(qs, ks, vs, mask)
    ref = naive_attention(qn, kn, vn, allowed)
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)
    assert out[:, :, layout.seq_ids == -1].abs().max() == 0  # padding rows are zero, not NaN
    upstream = torch.randn_like(ref)
    (out.double() * upstream).sum().backward()
    (ref * upstream).sum().backward()
    for a, b in ((qs, qn), (ks, kn), (vs, vn)):
        torch.testing.assert_close(a.grad.double(), b.grad, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_flex_forward_matches_sdpa_on_cpu(compiled, request):
    if compiled:
        request.getfixturevalue("run_inductor_cache")
    layout, mask_mod, q, k, v = _setup(chunk=2, window=3)
    flex = FlexBackend(BLOCK, compiled=compiled)
    sdpa = SdpaBackend()
    with torch.no_grad():
        out_flex = flex.attend(q, k, v, flex.build_mask(mask_mod, layout.length, "cpu"))
        out_sdpa = sdpa.attend(q, k, v, sdpa.build_mask(mask_mod, layout.length, "cpu"))
    torch.testing.assert_close(out_flex, out_sdpa, rtol=1e-5, atol=1e-5)


def test_flex_block_mask_skips_blocks():
    layout, mask_mod, *_ = _setup(batch=2, chunk=1, window=1)
    block_mask = FlexBackend(BLOCK).build_mask(mask_mod, layout.length, "cpu")
    assert block_mask.sparsity() > 0  # the sparsity that pays on a GPU


def _cfg(attention):
    cfg = RunConfig()
    cfg.model.attention = attention
    return cfg


def test_resolve_backend_on_cpu():
    assert resolve_backend(_cfg("sdpa"), "cpu")[0] == "sdpa"
    error = flex_backward_error("cpu")
    name, reason = resolve_backend(_cfg("auto"), "cpu")
    if error:  # torch 2.13: no FlexAttention backward on CPU
        assert name == "sdpa" and "NotImplementedError" in reason and "dense" in reason
        with pytest.raises(BackendUnavailable, match="model.attention=sdpa"):
            resolve_backend(_cfg("flex"), "cpu")
    else:
        assert name == "flex"


def test_resolve_backend_prefers_flex_on_cuda():
    assert resolve_backend(_cfg("auto"), "cuda")[0] == "flex"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="flex backward needs a GPU on torch 2.13")
def test_flex_matches_sdpa_gradients_on_cuda():
    layout, mask_mod, q, k, v = _setup(device="cuda")
    flex, sdpa = FlexBackend(BLOCK), SdpaBackend()
    results = []
    for backend in (flex, sdpa):
        qs, ks, vs = (t.clone().requires_grad_() for t in (q, k, v))
        out = backend.attend(qs, ks, vs, backend.build_mask(mask_mod, layout.length, "cuda"))
        out.square().sum().backward()
        results.append((out, qs.grad, ks.grad, vs.grad))
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b, rtol=2e-3, atol=2e-3)
