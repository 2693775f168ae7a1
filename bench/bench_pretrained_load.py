"""Peak host memory per rank when loading a released-layout checkpoint: sharded (ours) vs full state dict.

sharded: model/parallel.py build_model with model.pretrained: the model is built on the meta device, sharded
         with FSDP2, materialised (to_empty), and each rank reads only its shards' slices (safetensors
         get_slice).
full:    what a full-state-dict load does (and the reference trainer: from_pretrained on CPU, then FSDP):
         every rank builds the whole fp32 model, loads every tensor into it (trainer.model.load_full,
         the same strict checks), then shards it.
Each variant runs as 2 fresh gloo ranks (torch.multiprocessing spawn); a rank reports its peak RSS
(/proc/self/status VmHWM) after imports and after loading, so the difference is what loading cost. The
checkpoint is a CPU-sized model in the released layout (bf16, as released), written by export_reference.

    .venv/bin/python bench/bench_pretrained_load.py [--quick]
"""

from __future__ import annotations

import json
import os
import resource
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import Table  # noqa: E402

WORLD = 2
SIZES = {
    "model.dim": 1024,  # 8 heads x 128
    "model.heads": 8,
    "model.depth": 8,
    "model.ffn_dim": 4096,
    "model.text_dim": 1024,
    "model.latent_channels": 16,
}
QUICK = {**SIZES, "model.depth": 4}


def _cfg(sizes: dict, pretrained: str = ""):
    from trainer.config import RunConfig, apply_overrides, check_config

    cfg = RunConfig()
    apply_overrides(cfg, {**sizes, "model.pretrained": pretrained}, "bench")
    cfg.model.activation_checkpointing = "none"
    check_config(cfg)
    return cfg


def _peak_mb() -> float:
    """This process's peak RSS (VmHWM: per address space; getrusage's ru_maxrss survives exec, so a
    spawned rank would inherit the parent's peak)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _rank(rank: int, mode: str, sizes: dict, folder: str, init: str, out: str) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=WORLD)
    from trainer.model import WorldModel, apply_pretrained_config, load_full
    from trainer.model.parallel import build_model, shard_model

    before = _peak_mb()
    cfg = _cfg(sizes, folder)
    if mode == "sharded":
        model = build_model(cfg, torch.device("cpu"))
    else:
        path = apply_pretrained_config(cfg)
        assert path is not None
        model = WorldModel(cfg)
        load_full(model, path)
        model = shard_model(model, cfg, torch.device("cpu"))
    local = sum(p.to_local().numel() for p in model.parameters())  # type: ignore[attr-defined]
    dist.barrier()
    result = {"rank": rank, "before_mb": before, "peak_mb": _peak_mb(), "local_params": local}
    Path(out, f"{mode}-{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


def run(quick: bool = False) -> list[Table]:
    import torch
    import torch.multiprocessing as mp

    from trainer.model import WorldModel, export_reference

    sizes = QUICK if quick else SIZES
    with tempfile.TemporaryDirectory() as tmp:
        cfg = _cfg(sizes)
        torch.manual_seed(0)
        model = WorldModel(cfg)
        params = sum(p.numel() for p in model.parameters())
        folder = export_reference(model, cfg, Path(tmp) / "released")
        assert folder is not None
        file_mb = sum(f.stat().st_size for f in folder.iterdir()) / 2**20
        del model
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        # freed buffers go back to the OS at once, so RSS follows live memory (as bench_attention does)
        os.environ["MALLOC_MMAP_THRESHOLD_"] = "65536"
        rows = []
        for mode in ("sharded", "full"):
            init = Path(tmp) / f"init-{mode}"
            mp.spawn(_rank, args=(mode, sizes, str(folder), str(init), tmp), nprocs=WORLD, join=True)
            for rank in range(WORLD):
                r = json.loads((Path(tmp) / f"{mode}-{rank}.json").read_text())
                delta = r["peak_mb"] - r["before_mb"]
                rows.append([mode, rank, r["before_mb"], r["peak_mb"], delta, r["local_params"] / 1e6])
    sharded = max(r[4] for r in rows if r[0] == "sharded")
    full = max(r[4] for r in rows if r[0] == "full")
    return [
        Table(
            f"Loading a released-layout checkpoint on {WORLD} ranks: peak RSS per rank",
            [
                "load",
                "rank",
                "RSS after imports (MB)",
                "peak RSS (MB)",
                "loading cost (MB)",
                "local params (M)",
            ],
            rows,
            ratio=f"sharded loading costs {sharded:.0f} MB per rank vs {full:.0f} MB for a full-state-dict "
            f"load ({sharded / full:.2f}x)",
            notes=[
                f"{params / 1e6:.1f}M params, fp32 in memory ({params * 4 / 2**20:.0f} MB whole, "
                f"{params * 4 / 2**20 / WORLD:.0f} MB per rank's shard); file {file_mb:.0f} MB bf16",
                f"sizes: {sizes}",
            ],
        )
    ]


if __name__ == "__main__":
    for t in run(quick="--quick" in sys.argv):
        print(t.markdown())
