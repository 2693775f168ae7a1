"""Our LingBot-VA training step vs the upstream reference's, in one process: tokens/s and where the time goes.

Same tiny config (the released structure, small), same weights (ours loaded strictly into theirs), same
inputs (one micro-batch from recipe/draws.py, converted to the reference's input_dict), same dtype (bf16: the
reference's forward_train casts its inputs to bf16, as FSDP mixed precision runs it) and the same attention
backend: SDPA with a dense mask evaluated from each implementation's own mask_mod (the reference's
FlexAttnFunc.init_mask is swapped for that, its custom_sdpa given the mask). The step is forward + the
reference's compute_loss (read from its wan_va/train.py at run time) or ours + backward. The two alternate
step by step (ABAB...), medians; then one profiled step each gives the top ops by self CPU time.

Needs the upstream code installed OUTSIDE this tree: $LINGBOT_PARITY_DIR (no default) with lingbot-va/
(upstream 58c2ae5, a git clone) and venv/ (its Python with diffusers); docs/model.md has the commands that
make it. Without it the bench reports a skip and those commands.
Run:  .venv/bin/python bench/bench_reference.py [--quick]
(re-runs itself under the parity venv's Python, with this checkout on PYTHONPATH).
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import REPO, Table, median  # noqa: E402

PARITY = Path(os.environ["LINGBOT_PARITY_DIR"]) if os.environ.get("LINGBOT_PARITY_DIR") else None
REFERENCE_SRC = PARITY / "lingbot-va" / "wan_va" if PARITY else None
PARITY_PYTHON = PARITY / "venv" / "bin" / "python" if PARITY else None
# docs/model.md "Parity with the upstream reference" has these commands too
PARITY_SETUP = (
    'export LINGBOT_PARITY_DIR="$HOME/lingbot-parity"; '
    'git clone https://github.com/hewu2008/lingbot-va "$LINGBOT_PARITY_DIR/lingbot-va"; '
    'git -C "$LINGBOT_PARITY_DIR/lingbot-va" checkout 58c2ae5; '
    'python3.11 -m venv "$LINGBOT_PARITY_DIR/venv"; '
    '"$LINGBOT_PARITY_DIR/venv/bin/pip" install torch==2.13.0 diffusers einops safetensors numpy pyyaml'
)


def parity_missing() -> str | None:
    """Why the upstream install cannot be used (with the commands that make it), or None."""
    if PARITY is None:
        return f"LINGBOT_PARITY_DIR is not set; make the upstream install with: {PARITY_SETUP}"
    assert REFERENCE_SRC is not None and PARITY_PYTHON is not None
    if not (REFERENCE_SRC / "modules" / "model.py").is_file() or not PARITY_PYTHON.is_file():
        return f"no upstream install at LINGBOT_PARITY_DIR={PARITY}; make it with: {PARITY_SETUP}"
    return None


BENCH = {
    "model.dim": 192,  # 4 heads x 48
    "model.heads": 4,
    "model.depth": 4,
    "model.ffn_dim": 768,
    "model.text_dim": 64,
    "model.freq_dim": 256,
    "model.latent_channels": 16,
    "model.latent_size": 8,
    "model.attn_block": 128,
    "data.frames": 8,
    "data.actions_per_frame": 4,
    "train.batch_size": 1,
}
VIEWS, TEXT_LEN = 2, 32


def skip_reason() -> str | None:
    if REFERENCE_SRC is None or not (REFERENCE_SRC / "modules" / "model.py").is_file():
        return f"no upstream code (set LINGBOT_PARITY_DIR); make it with: {PARITY_SETUP}"
    try:
        import diffusers  # noqa: F401
        import einops  # noqa: F401
    except ImportError as exc:
        if not PARITY_PYTHON.is_file():
            return f"the reference needs diffusers/einops ({exc}); no {PARITY_PYTHON} to run it with"
        return "reexec"
    return None


def _import_reference():
    import importlib.machinery
    import types

    if "flash_attn" not in sys.modules:  # imported at module level by the reference, unused on this path
        try:
            import flash_attn  # noqa: F401
        except ImportError:
            stub = types.ModuleType("flash_attn")
            stub.__spec__ = importlib.machinery.ModuleSpec("flash_attn", None)
            stub.flash_attn_func = None  # type: ignore[attr-defined]
            sys.modules["flash_attn"] = stub
    sys.path.insert(0, str(REFERENCE_SRC))
    import importlib.util

    import modules.model as ref_model

    def load(relative: str):  # by file: wan_va/utils/__init__ also imports the websocket server
        spec = importlib.util.spec_from_file_location(
            f"reference_{Path(relative).stem}", REFERENCE_SRC / relative
        )
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    scheduler, utils = load("utils/scheduler.py"), load("utils/utils.py")
    return ref_model, scheduler.FlowMatchScheduler, utils.get_mesh_id, utils.data_seq_to_patch


def _reference_compute_loss(data_seq_to_patch):
    """The reference Trainer.compute_loss, compiled from its own wan_va/train.py (not copied here)."""
    import torch
    import torch.nn.functional as F
    from einops import rearrange

    tree = ast.parse((REFERENCE_SRC / "train.py").read_text())
    (fn,) = [
        node
        for cls in tree.body
        if isinstance(cls, ast.ClassDef)
        for node in cls.body
        if isinstance(node, ast.FunctionDef) and node.name == "compute_loss"
    ]
    namespace = {"F": F, "rearrange": rearrange, "data_seq_to_patch": data_seq_to_patch, "torch": torch}
    exec(compile(ast.Module(body=[fn], type_ignores=[]), str(REFERENCE_SRC / "train.py"), "exec"), namespace)
    return namespace["compute_loss"]


def measure(rounds: int) -> dict:
    import torch
    import torch.nn.functional as F
    from einops import rearrange

    from trainer.config import RunConfig, apply_overrides, check_config
    from trainer.model import WorldModel
    from trainer.model.masks import dense_mask
    from trainer.recipe.batch import CleanBatch, action_slot_mask
    from trainer.recipe.draws import EmptyText, draw_micro_batch

    torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "2")))
    ref_model, Scheduler, get_mesh_id, data_seq_to_patch = _import_reference()
    compute_loss = _reference_compute_loss(data_seq_to_patch)

    cfg = RunConfig()
    apply_overrides(cfg, BENCH, "bench")
    cfg.recipe.noisy_history_prob = 1.0  # exercise the history path in both
    check_config(cfg)
    m = cfg.model
    torch.manual_seed(0)
    ours = WorldModel(cfg)
    ours.set_attention_backend("sdpa", reason="bench: same backend as the reference run")

    state: dict = {}

    def init_mask(latent_shape, action_shape, padded_length, chunk_size, window_size, patch_size, device):
        """The reference's ids and its own _get_mask_mod, materialised densely (instead of a BlockMask)."""
        b, _, lf, lh, lw = latent_shape
        _, _, af, ah, aw = action_shape
        grid = (lf // patch_size[0], lh // patch_size[1], lw // patch_size[2])
        lseq = torch.arange(b)[:, None, None, None].expand(-1, *grid).flatten()
        aseq = torch.arange(b)[:, None, None, None].expand(-1, af, ah, aw).flatten()
        lfr = torch.arange(lf)[None, :, None, None].expand(b, -1, grid[1], grid[2]).flatten()
        afr = torch.arange(af)[None, :, None, None].expand(b, -1, ah, aw).flatten()
        seq = F.pad(torch.cat([lseq] * 2 + [aseq] * 2), (0, padded_length), value=-1)
        frames = torch.cat([lfr // chunk_size * 2] * 2 + [afr // chunk_size * 2 + 1] * 2)
        frames = F.pad(frames, (0, padded_length), value=-1)
        noise = torch.cat(
            [torch.zeros_like(lfr), torch.ones_like(lfr), torch.zeros_like(afr), torch.ones_like(afr)]
        )
        noise = F.pad(noise, (0, padded_length), value=-1)
        mask_mod = ref_model.FlexAttnFunc._get_mask_mod(seq, frames, noise, window_size)
        allowed = dense_mask(mask_mod, len(seq), device)
        has_key = allowed.any(-1, keepdim=True)
        state["mask"], state["has_key"] = allowed | ~has_key, has_key

    def sdpa(q, k, v):
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        if q.shape[2] == k.shape[2]:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=state["mask"]) * state["has_key"]
        else:  # cross-attention, one sample: every query attends the whole prompt (as ours with B = 1)
            out = F.scaled_dot_product_attention(q, k, v)
        return out.transpose(1, 2)

    ref_model.FlexAttnFunc.init_mask = staticmethod(init_mask)
    ref_model.custom_sdpa = sdpa
    ref = ref_model.WanTransformer3DModel(
        patch_size=[1, 2, 2],
        num_attention_heads=m.heads,
        attention_head_dim=m.dim // m.heads,
        in_channels=m.latent_channels,
        out_channels=m.latent_channels,
        action_dim=m.action_dim,
        text_dim=m.text_dim,
        freq_dim=m.freq_dim,
        ffn_dim=m.ffn_dim,
        num_layers=m.depth,
        cross_attn_norm=m.cross_attn_norm,
        eps=m.eps,
        rope_max_seq_len=m.rope_max_seq_len,
        attn_mode="torch",
    )
    ref.load_state_dict(ours.state_dict(), strict=True)
    ours, ref = ours.to(torch.bfloat16), ref.to(torch.bfloat16)

    # one micro-batch in our contract, and the same draws as the reference's input_dict
    f, n, c, side = cfg.data.frames, cfg.data.actions_per_frame, m.latent_channels, m.latent_size
    g = torch.Generator().manual_seed(0)
    mask = action_slot_mask(m.action_dim, 8)
    clean: CleanBatch = {
        "latents": torch.randn(1, f, c, side, side * VIEWS, generator=g),
        "actions": torch.randn(1, f * n, m.action_dim, generator=g).clamp(-1.5, 1.5) * mask,
        "action_mask": mask.expand(1, f * n, -1).clone(),
        "text_emb": torch.randn(1, TEXT_LEN, m.text_dim, generator=g),
        "text_mask": torch.ones(1, TEXT_LEN, dtype=torch.bool),
    }
    empty = EmptyText(torch.zeros(TEXT_LEN, m.text_dim), torch.zeros(TEXT_LEN, dtype=torch.bool))
    batch: dict[str, Any] = dict(draw_micro_batch(cfg.recipe, clean, empty, g))
    batch["frames_per_chunk"], batch["window"] = torch.tensor(2), torch.tensor(4)

    sched_v = Scheduler(shift=cfg.recipe.video_shift, sigma_min=0.0, extra_one_step=True)
    sched_v.set_timesteps(1000, training=True)
    sched_a = Scheduler(shift=cfg.recipe.action_shift, sigma_min=0.0, extra_one_step=True)
    sched_a.set_timesteps(1000, training=True)

    def bcfhw(x):
        return x.permute(0, 2, 1, 3, 4).contiguous()

    def act(x):
        return rearrange(x, "b (f n) c -> b c f n 1", f=f).contiguous()

    def ref_inputs() -> dict:
        x, amask = bcfhw(batch["latents"]), act(batch["action_mask"]).float()
        t_v, t_c, t_a = (batch[k][0] * 1000 for k in ("latent_sigma", "history_sigma", "action_sigma"))
        a = act(batch["actions"])
        rows, cols = side // 2, side * VIEWS // 2
        return {
            "latent_dict": {
                "noisy_latents": sched_v.add_noise(x, bcfhw(batch["latent_noise"]), t_v, t_dim=2),
                "latent": sched_v.add_noise(x, bcfhw(batch["history_noise"]), t_c, t_dim=2),
                "targets": sched_v.training_target(x, bcfhw(batch["latent_noise"]), t_v),
                "timesteps": t_v[None],
                "cond_timesteps": t_c[None],
                "grid_id": get_mesh_id(f, rows, cols, t=0, f_w=1, f_shift=0, action=False)[None],
                "text_emb": batch["text_emb"].bfloat16(),  # the reference stores prompt embeddings in bf16
            },
            "action_dict": {
                "noisy_latents": sched_a.add_noise(a, act(batch["action_noise"]), t_a, t_dim=2) * amask,
                "latent": a * amask,
                "targets": sched_a.training_target(a, act(batch["action_noise"]), t_a) * amask,
                "timesteps": t_a[None],
                "cond_timesteps": torch.zeros_like(t_a)[None],
                "grid_id": get_mesh_id(f, n, 1, t=1, f_w=1, f_shift=0, action=True)[None],
                "text_emb": batch["text_emb"].bfloat16(),  # the reference stores prompt embeddings in bf16
                "actions_mask": amask,
            },
            "chunk_size": 2,
            "window_size": 4,
        }

    class LossHost:  # what compute_loss reads from the reference Trainer
        patch_size = (1, 2, 2)
        train_scheduler_latent, train_scheduler_action = sched_v, sched_a
        gradient_accumulation_steps = 1

    def step_ours() -> tuple[float, float]:
        out = ours(batch)
        out["loss"].backward()
        return float(out["latent_loss"]), float(out["action_loss"])

    def step_ref() -> tuple[float, float]:
        inputs = ref_inputs()  # the reference builds its input_dict (noise mixing) inside its step too
        lv, la = compute_loss(LossHost(), inputs, ref(inputs, train_mode=True))
        (lv + la).backward()
        return float(lv), float(la)

    tokens = 2 * (f * (side // 2) * (side * VIEWS // 2) + f * n)
    losses = {"ours": step_ours(), "reference": step_ref()}  # warm-up
    step_ours(), step_ref()
    times: dict[str, list[float]] = {"ours": [], "reference": []}
    for _ in range(rounds):
        for name, fn in (("ours", step_ours), ("reference", step_ref)):
            for model in (ours, ref):
                model.zero_grad(set_to_none=True)
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)

    from torch.profiler import ProfilerActivity, profile

    top: dict[str, list] = {}
    for name, fn in (("ours", step_ours), ("reference", step_ref)):
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            fn()
        events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
        total = sum(e.self_cpu_time_total for e in events)
        top[name] = [(e.key, e.self_cpu_time_total / total) for e in events[:6]]
    return {
        "tokens": tokens,
        "times": times,
        "losses": losses,
        "top": top,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
    }


def run(quick: bool = False) -> list[Table]:
    reason = skip_reason()
    rounds = 3 if quick else 7
    if reason == "reexec":
        env = dict(os.environ, PYTHONPATH=f"{REPO}:{os.environ.get('PYTHONPATH', '')}")
        proc = subprocess.run(
            [str(PARITY_PYTHON), __file__, "--json", str(rounds)],
            capture_output=True,
            text=True,
            env=env,
            cwd=REPO,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"bench_reference under {PARITY_PYTHON} failed:\n{proc.stderr[-4000:]}")
        result = json.loads(proc.stdout.strip().splitlines()[-1])
    elif reason:
        return [Table("Training step vs the reference", ["skipped"], [[reason]], ratio=f"skipped: {reason}")]
    else:
        result = measure(rounds)
    return [table(result)]


def table(result: dict) -> Table:
    t_ours, t_ref = median(result["times"]["ours"]), median(result["times"]["reference"])
    best_ours, best_ref = min(result["times"]["ours"]), min(result["times"]["reference"])
    tok = result["tokens"]
    rows = [
        ["ours", t_ours * 1e3, tok / t_ours, *result["losses"]["ours"]],
        ["reference", t_ref * 1e3, tok / t_ref, *result["losses"]["reference"]],
    ]
    notes = [
        f"{tok} tokens per micro-batch (1 sample, 2 views, {BENCH['data.frames']} frames), bf16, CPU, "
        f"{result['threads']} threads, torch {result['torch']}, "
        f"{len(result['times']['ours'])} alternating rounds",
        "per-round ms ours: " + ", ".join(f"{t * 1e3:.0f}" for t in result["times"]["ours"]),
        "per-round ms reference: " + ", ".join(f"{t * 1e3:.0f}" for t in result["times"]["reference"]),
    ]
    for name in ("ours", "reference"):
        notes.append(
            f"top self-CPU ops, {name}: " + ", ".join(f"{k} {share:.0%}" for k, share in result["top"][name])
        )
    return Table(
        "Training step (forward + loss + backward) vs the upstream reference",
        ["implementation", "step ms (median)", "tokens/s", "latent_loss", "action_loss"],
        rows,
        ratio=f"ours / reference tokens/s = {t_ref / t_ours:.2f}x on medians, "
        f"{best_ref / best_ours:.2f}x on the fastest round of each (less sensitive to other load)",
        notes=notes,
    )


if __name__ == "__main__":
    if "--json" in sys.argv:
        print(json.dumps(measure(int(sys.argv[sys.argv.index("--json") + 1]))))
    else:
        for t in run(quick="--quick" in sys.argv):
            print(t.markdown())
