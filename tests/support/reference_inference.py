"""A golden inference session of the UPSTREAM LingBot-VA server (58c2ae5), for tests/test_inference_parity.py.

Runs with a Python that has the upstream's dependencies (diffusers, einops, easydict, transformers ...) and
imports the upstream tree at $LINGBOT_UPSTREAM_DIR/wan_va (nothing of it is in this tree). It builds a seeded
tiny transformer with the upstream class (save_pretrained), then drives the upstream VA_Server exactly as its
robot client does (infer(reset) -> infer(chunk) -> infer(compute_kv_cache) -> infer(chunk) ...), fp32 on CPU,
with the VAE/text encoder replaced by given latents/embeddings and torch.randn by given noise, and records
every chunk's normalised actions (before post-processing), robot-unit actions and latents:

    LINGBOT_UPSTREAM_DIR=<upstream checkout> <its python> tests/support/reference_inference.py OUT_DIR
    .venv/bin/python -m tests.support.inference_golden OUT_DIR    # -> tests/fixtures/inference_parity.*

Cases: a = guidance 5 and action guidance 3 (two rows), window 4 (three chunks: the third evicts the
oldest history); b = no guidance (one row), window 30, video_exec_step 3.
"""

import importlib.machinery
import json
import os
import shutil
import sys
import types
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

if not os.environ.get("LINGBOT_UPSTREAM_DIR"):
    sys.exit("LINGBOT_UPSTREAM_DIR is not set: set it to a checkout of hewu2008/lingbot-va at 58c2ae5")
UPSTREAM = Path(os.environ["LINGBOT_UPSTREAM_DIR"]) / "wan_va"
if not (UPSTREAM / "wan_va_server.py").is_file():
    sys.exit(f"no upstream server at {UPSTREAM}/wan_va_server.py: check LINGBOT_UPSTREAM_DIR")
for name in ("flash_attn", "flash_attn_interface"):  # imported at module level, unused with attn_mode torch
    stub = types.ModuleType(name)
    stub.__spec__ = importlib.machinery.ModuleSpec(name, None)
    stub.flash_attn_func = None
    sys.modules[name] = stub
sys.path.insert(0, str(UPSTREAM))
import wan_va_server as server  # noqa: E402
from easydict import EasyDict  # noqa: E402
from modules.model import WanTransformer3DModel  # noqa: E402
from utils import FlowMatchScheduler  # noqa: E402

torch.set_num_threads(2)
OUT = Path(sys.argv[1])
shutil.rmtree(OUT, ignore_errors=True)
OUT.mkdir(parents=True)
TINY = dict(
    patch_size=[1, 2, 2],
    num_attention_heads=2,
    attention_head_dim=24,
    in_channels=8,
    out_channels=8,
    action_dim=30,
    text_dim=32,
    freq_dim=32,
    ffn_dim=96,
    num_layers=2,
    cross_attn_norm=True,
    eps=1e-06,
    rope_max_seq_len=1024,
    attn_mode="torch",
)
SLOTS = list(range(7)) + [28]  # FurnitureBench's 8 channels in the 30 model channels
C, H, VIEWS, F, N, TEXT = 8, 4, 2, 3, 4, 16
CASES = {
    "a": dict(
        seed=11,
        chunks=3,
        window=4,
        guidance=5.0,
        action_guidance=3.0,
        video_steps=4,
        action_steps=5,
        video_shift=5.0,
        action_shift=1.0,
        video_exec_step=-1,
    ),
    "b": dict(
        seed=12,
        chunks=2,
        window=30,
        guidance=1.0,
        action_guidance=1.0,
        video_steps=4,
        action_steps=5,
        video_shift=5.0,
        action_shift=0.5,
        video_exec_step=3,
    ),
}

torch.manual_seed(0)
model = WanTransformer3DModel(**TINY)
g = torch.Generator().manual_seed(100)
with torch.no_grad():
    for _, p in sorted(model.named_parameters()):
        p.add_(0.05 * torch.randn(p.shape, generator=g))
model.save_pretrained(str(OUT / "transformer"), safe_serialization=True)
model = WanTransformer3DModel.from_pretrained(str(OUT / "transformer"), torch_dtype=torch.float32).eval()


class Noise:
    """Stands in for the server module's `torch`: randn returns the given noise, in order."""

    def __init__(self):
        self.queue = []

    def randn(self, *shape, **kw):
        x = self.queue.pop(0)
        assert tuple(x.shape[2:]) == tuple(shape[2:]), (x.shape, shape)
        return x.clone()

    def __getattr__(self, name):
        return getattr(torch, name)


def make_server(c: dict, prompt_emb, empty_emb, q01, q99, latents_for):
    cfg = EasyDict(
        param_dtype=torch.float32,
        save_root=str(OUT / "save"),
        patch_size=(1, 2, 2),
        env_type="none",
        attn_window=c["window"],
        frame_chunk_size=F,
        height=16 * H,
        width=16 * H,
        action_dim=30,
        action_per_frame=N,
        obs_cam_keys=["front", "wrist"],
        guidance_scale=c["guidance"],
        action_guidance_scale=c["action_guidance"],
        num_inference_steps=c["video_steps"],
        video_exec_step=c["video_exec_step"],
        action_num_inference_steps=c["action_steps"],
        snr_shift=c["video_shift"],
        action_snr_shift=c["action_shift"],
        used_action_channel_ids=SLOTS,
        action_norm_method="quantiles",
        norm_stat={"q01": q01, "q99": q99},
    )
    inverse = [len(SLOTS)] * 30
    for i, j in enumerate(SLOTS):
        inverse[j] = i
    cfg.inverse_used_action_channel_ids = inverse
    srv = server.VA_Server.__new__(server.VA_Server)
    srv.cache_name, srv.job_config, srv.save_root = "pos", cfg, cfg.save_root
    srv.dtype, srv.device, srv.env_type = torch.float32, torch.device("cpu"), "none"
    srv.scheduler = FlowMatchScheduler(shift=c["video_shift"], sigma_min=0.0, extra_one_step=True)
    srv.action_scheduler = FlowMatchScheduler(shift=c["action_shift"], sigma_min=0.0, extra_one_step=True)
    srv.scheduler.set_timesteps(1000, training=True)
    srv.action_scheduler.set_timesteps(1000, training=True)
    srv.transformer = model
    srv.streaming_vae = types.SimpleNamespace(clear_cache=lambda: None)
    srv.streaming_vae_half = None

    def encode_prompt(prompt, do_classifier_free_guidance=True, **kw):  # its T5, replaced by the embeddings
        return prompt_emb[None], (empty_emb[None] if do_classifier_free_guidance else None)

    srv.encode_prompt = encode_prompt
    srv._encode_obs = latents_for  # its VAE, replaced by the latents
    return srv


def run_case(name: str, c: dict) -> dict:
    g = torch.Generator().manual_seed(c["seed"])
    frames = c["chunks"] * F
    prompt_emb = torch.zeros(TEXT, 32)
    prompt_emb[:9] = torch.randn(9, 32, generator=g)
    empty_emb = torch.zeros(TEXT, 32)
    empty_emb[:1] = torch.randn(1, 32, generator=g)
    q01 = (torch.rand(8, generator=g) * -1 - 0.2).tolist()
    q99 = (torch.rand(8, generator=g) + 0.2).tolist()
    lo, hi = torch.tensor(q01), torch.tensor(q99)
    real_latents = torch.randn(frames, C, H, H * VIEWS, generator=g)  # ours: [F, C, H, W]
    real_actions = lo + (hi - lo) * torch.rand(frames * N, 8, generator=g)  # robot units, [F*N, 8]
    video_noise = torch.randn(c["chunks"], F, C, H, H * VIEWS, generator=g)
    action_noise = torch.randn(c["chunks"], F * N, 30, generator=g)
    q01_30, q99_30 = [0.0] * 30, [0.0] * 30
    for i, s in enumerate(SLOTS):
        q01_30[s], q99_30[s] = q01[i], q99[i]

    def upstream_latents(x):  # ours [F, C, H, W] -> its [1, C, F, H, W]
        return x.permute(1, 0, 2, 3)[None].contiguous()

    srv = make_server(c, prompt_emb, empty_emb, q01_30, q99_30, lambda obs: obs["obs"])
    noise = Noise()
    server.torch = noise
    captured = []
    post = srv.postprocess_action
    srv.postprocess_action = lambda a: (captured.append(a.clone()), post(a))[1]
    srv.infer(dict(reset=True, prompt="tiny"))
    out = {}
    for k in range(c["chunks"]):
        noise.queue = [
            upstream_latents(video_noise[k]),
            action_noise[k].reshape(F, N, 30).permute(2, 0, 1)[None, ..., None],
        ]
        obs = dict(obs=upstream_latents(real_latents[:1])) if k == 0 else dict(obs=None)
        robot, lat = srv._infer(obs, frame_st_id=srv.frame_st_id)  # what infer(obs) runs for a chunk
        out[f"chunk{k}.latents"] = lat[0].permute(1, 0, 2, 3)
        out[f"chunk{k}.actions_norm"] = captured[-1][0, ..., 0].permute(1, 2, 0).reshape(F * N, 30)
        out[f"chunk{k}.actions_robot"] = (
            torch.from_numpy(np.ascontiguousarray(robot)).permute(1, 2, 0).reshape(F * N, 8)
        )
        if k + 1 < c["chunks"]:
            sl = slice(k * F, (k + 1) * F)
            new = (
                real_latents[sl][1:] if k == 0 else real_latents[sl]
            )  # chunk 0: its init latent is prepended
            state = real_actions[k * F * N : (k + 1) * F * N].reshape(F, N, 8).permute(2, 0, 1).numpy()
            srv.infer(dict(compute_kv_cache=True, obs=upstream_latents(new), state=state))
    server.torch = torch
    inputs = dict(
        prompt_emb=prompt_emb,
        empty_emb=empty_emb,
        q01=torch.tensor(q01),
        q99=torch.tensor(q99),
        real_latents=real_latents,
        real_actions=real_actions,
        video_noise=video_noise,
        action_noise=action_noise,
    )
    saved = {f"in.{k}": v.contiguous() for k, v in inputs.items()}
    saved.update({f"out.{k}": v.contiguous() for k, v in out.items()})
    save_file(saved, str(OUT / f"case_{name}.safetensors"))
    return c


summary = {
    "reference": "hewu2008/lingbot-va@58c2ae5 wan_va_server.VA_Server (fp32, CPU, attn_mode torch)",
    "torch": torch.__version__,
    "config": TINY,
    "frames_per_chunk": F,
    "actions_per_frame": N,
    "views": VIEWS,
    "cases": {n: run_case(n, c) for n, c in CASES.items()},
}
(OUT / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
print(f"wrote {OUT}")
