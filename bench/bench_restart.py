"""Restart cost: time to the first compiled FlexAttention call with cold vs warm Inductor/Triton caches.

Each run is a fresh Python process (as a restarted or requeued job is) with its own
TORCHINDUCTOR_CACHE_DIR, TRITON_CACHE_DIR and TMPDIR (Inductor keeps precompiled headers under the
temp dir whatever its cache dir says). Cold: all three empty. Warm: the same three directories again,
as a job that resumes on a node with the caches of its previous attempt (or a seeded node-local copy).
The call is the trainer's shared compiled flex_attention with the LingBot mask, forward (the only pass
FlexAttention has on CPU with torch 2.13).

    .venv/bin/python bench/bench_restart.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import REPO, Table, median  # noqa: E402


def _child() -> None:
    t0 = time.perf_counter()
    import torch
    from torch.nn.attention.flex_attention import create_block_mask

    from trainer.model.attention import _compiled_flex_attention
    from trainer.model.masks import SequenceShape, lingbot_mask_mod, token_layout

    imported = time.perf_counter()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    layout = token_layout(
        SequenceShape(frames=8, tokens_per_frame=60, actions_per_frame=4), 1, 2, 128, device
    )
    mask = create_block_mask(
        lingbot_mask_mod(layout, 4), None, None, layout.length, layout.length, device=device
    )
    q = torch.randn(1, 4, layout.length, 32, device=device)
    masked = time.perf_counter()
    flex = _compiled_flex_attention()
    flex(q, q, q, block_mask=mask)
    if device == "cuda":
        torch.cuda.synchronize()
    first = time.perf_counter()
    flex(q, q, q, block_mask=mask)
    second = time.perf_counter()
    print(json.dumps({"import_s": imported - t0, "mask_s": masked - imported, "first_call_s": first - masked,
                      "second_call_s": second - first}))  # fmt: skip


def _one(cache: Path) -> dict:
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor"),
        "TRITON_CACHE_DIR": str(cache / "triton"),
        "TMPDIR": str(cache / "tmp"),
    }
    (cache / "tmp").mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, __file__, "--child"], env=env, capture_output=True, text=True, timeout=600
    )
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"bench_restart child exited {proc.returncode}:\n{proc.stderr[-4000:]}")
    return {"wall_s": wall, **json.loads(proc.stdout.strip().splitlines()[-1])}


def run(quick: bool = False) -> list[Table]:
    warm_runs = 1 if quick else 2
    with tempfile.TemporaryDirectory(prefix="bench_restart_") as tmp:
        cache = Path(tmp)
        cold = _one(cache)
        warm = [_one(cache) for _ in range(warm_runs)]
        size = sum(p.stat().st_size for p in cache.rglob("*") if p.is_file())
    keys = ("wall_s", "import_s", "mask_s", "first_call_s", "second_call_s")
    rows = [["cold (empty caches)"] + [cold[k] for k in keys]]
    rows.append([f"warm (same caches, median of {warm_runs})"] + [median(w[k] for w in warm) for k in keys])
    table = Table(
        title="Restart cost: fresh process to first compiled flex_attention call (1024 tokens, LingBot mask)",
        columns=["caches", "process wall s", "import s", "mask s", "first call (compile) s", "second call s"],
        rows=rows,
        ratio=f"warm / cold time to first call = {rows[1][1] / rows[0][1]:.2f} "
        f"(first call alone {rows[1][4] / rows[0][4]:.2f}); caches after the runs: {size / 2**20:.1f} MiB",
        notes=[
            "TORCHINDUCTOR_CACHE_DIR, TRITON_CACHE_DIR and TMPDIR private to this bench; on a cluster the "
            "launcher seeds a node-local TRITON_CACHE_DIR from the shared one for the warm case."
        ],  # fmt: skip
    )
    return [table]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child()
        return
    for table in run(args.quick):
        print(table.markdown())


if __name__ == "__main__":
    main()
