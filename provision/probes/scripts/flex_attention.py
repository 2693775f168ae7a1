"""FlexAttention with a LingBot-VA-style block mask under torch.compile, against SDPA with the same
mask, dense. On CPU it compiles through Inductor's C++ path, on a GPU through Triton."""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from envcheck_probe_common import collector_off, emit, failed, located, outside

BLOCKS, PER_BLOCK, WINDOW = 4, 64, 2  # tokens: [noisy chunks | clean chunks], PER_BLOCK per chunk


def _compiler(gpu: bool) -> tuple[str | None, str | None]:
    """The compiler this compile will use: Inductor's C++ on CPU, Triton's C (driver build) on a GPU."""
    try:
        if gpu:
            from triton.runtime import build

            compiler = build._find_compiler("c")
        else:
            from torch._inductor import cpp_builder

            compiler = cpp_builder.get_cpp_compiler()
        return compiler, located(compiler, os.environ.get("PATH", ""))
    except Exception:
        return None, None  # torch.compile raises the real error the way a job sees it


def main(args: dict) -> None:
    try:
        with collector_off():
            import torch
            import torch._inductor.config as inductor_config
            import torch.nn.functional as F
            from torch.nn.attention.flex_attention import create_block_mask, create_mask, flex_attention
    except Exception as exc:
        return failed("import", exc)
    inductor_config.compile_threads = 1
    torch.set_num_threads(2)
    gpu = args["gpu"] and torch.cuda.is_available()
    device = "cuda" if gpu else "cpu"
    half = BLOCKS * PER_BLOCK
    pos = torch.arange(2 * half, device=device)
    block_id = (pos % half) // PER_BLOCK
    noisy = pos < half

    def lingbot_mask(b, h, q, kv):
        qb, kb, qn, kn = block_id[q], block_id[kv], noisy[q], noisy[kv]
        clean_clean = ~qn & ~kn & (kb <= qb)  # block-causal
        noisy_clean = qn & ~kn & (kb < qb)  # strictly earlier chunks
        noisy_noisy = qn & kn & (kb == qb)  # own chunk only
        return (clean_clean | noisy_clean | noisy_noisy) & (qb - kb <= WINDOW)

    compiler, real = _compiler(gpu)
    if compiler is not None and args["require_under"] and outside(real, args["require_under"]):
        return emit(ok=False, stage="locate", compiler=compiler, compiler_path=real)
    n = 2 * half
    block_mask = create_block_mask(lingbot_mask, None, None, n, n, device=device)
    dense = create_mask(lingbot_mask, None, None, n, n, device=device)
    dtype = torch.bfloat16 if gpu else torch.float32
    gen = torch.Generator(device=device).manual_seed(0)
    q, k, v = (
        torch.randn(2, 4, n, 64, device=device, dtype=dtype, generator=gen, requires_grad=gpu)
        for _ in range(3)
    )
    start = time.perf_counter()
    try:
        out = torch.compile(flex_attention, fullgraph=True)(q, k, v, block_mask=block_mask)
        assert isinstance(out, torch.Tensor), type(out)
        if gpu:
            out.float().square().sum().backward()
    except Exception as exc:
        return failed("compile", exc, device=device, compiler=compiler, compiler_path=real)
    seconds = time.perf_counter() - start
    q32, k32, v32 = (t.detach().float().requires_grad_(gpu) for t in (q, k, v))
    ref = F.scaled_dot_product_attention(q32, k32, v32, attn_mask=dense)
    result: dict[str, Any] = {
        "device": device,
        "tokens": n,
        "compiler": compiler,
        "compiler_path": real,
        "masked_share": 1 - dense.float().mean().item(),
        "forward_max_abs_error": (out.float() - ref).abs().max().item(),
        "compile_s": seconds,
    }
    ok = result["forward_max_abs_error"] < (2e-2 if gpu else 1e-4)
    if gpu:
        ref.square().sum().backward()
        errors = []
        for a, b in ((q, q32), (k, k32), (v, v32)):
            assert a.grad is not None and b.grad is not None
            errors.append((a.grad.float() - b.grad).abs().max().item() / max(b.grad.abs().max().item(), 1e-6))
        result["backward_max_abs_error"] = max(errors)
        ok = ok and result["backward_max_abs_error"] < 5e-2
    emit(ok=ok, stage="done", **result)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
