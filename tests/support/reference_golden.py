"""A golden run of the UPSTREAM LingBot-VA (58c2ae5), in the file format tests/support/golden.py reads.

Runs with the upstream install's Python ($LINGBOT_PARITY_DIR/venv, with diffusers; docs/model.md has the
commands that make the install); reads the upstream model.py from its git clone
($LINGBOT_PARITY_DIR/lingbot-va, commit 58c2ae5) at run time and
executes it with forward_train's four bf16 input casts made fp32 (nothing of it is in this tree), the
self-attention mask from its own FlexAttnFunc._get_mask_mod evaluated densely for SDPA, the cross-attention
mask of its flex path (own sample's prompt, all 512 positions), and its own Trainer.compute_loss:

    PYTHONPATH=. "$LINGBOT_PARITY_DIR/venv/bin/python" tests/support/reference_golden.py /tmp/own_golden
    LINGBOT_GOLDEN_DIR=/tmp/own_golden .venv/bin/python -m tests.support.golden   # -> tests/fixtures
"""

import json
import shutil
import subprocess
import sys
import types
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from safetensors.torch import save_file

from bench.bench_reference import PARITY, PARITY_SETUP, _import_reference, _reference_compute_loss
from trainer.model.masks import dense_mask

if PARITY is None:
    sys.exit(f"LINGBOT_PARITY_DIR is not set; make the upstream install with: {PARITY_SETUP}")
UPSTREAM = PARITY / "lingbot-va"
torch.set_num_threads(2)
_, Sched, get_mesh_id, data_seq_to_patch = _import_reference()
# upstream model.py with forward_train's four `.to(torch.bfloat16)` input casts made fp32 (nothing else)
src = subprocess.run(
    ["git", "-C", str(UPSTREAM), "show", "58c2ae5:wan_va/modules/model.py"],
    capture_output=True,
    text=True,
    check=True,
).stdout
assert src.count(".to(torch.bfloat16)") == 4, src.count(".to(torch.bfloat16)")
RM = types.ModuleType("reference_model_fp32")
RM.__file__ = "model.py"
exec(
    compile(
        src.replace(".to(torch.bfloat16)", ".to(torch.float32)"),
        str(UPSTREAM / "wan_va" / "modules" / "model.py"),
        "exec",
    ),
    RM.__dict__,
)
compute_loss = _reference_compute_loss(data_seq_to_patch)
OUT = Path(sys.argv[1])
shutil.rmtree(OUT, ignore_errors=True)
OUT.mkdir(parents=True)
S = {}


def init_mask(latent_shape, action_shape, padded_length, chunk_size, window_size, patch_size, device):
    b, _, lf, lh, lw = latent_shape
    _, _, af, ah, aw = action_shape
    grid = (lf // patch_size[0], lh // patch_size[1], lw // patch_size[2])
    lseq = torch.arange(b)[:, None, None, None].expand(-1, *grid).flatten()
    aseq = torch.arange(b)[:, None, None, None].expand(-1, af, ah, aw).flatten()
    lfr = torch.arange(lf)[None, :, None, None].expand(b, -1, grid[1], grid[2]).flatten()
    afr = torch.arange(af)[None, :, None, None].expand(b, -1, ah, aw).flatten()
    seq = F.pad(torch.cat([lseq] * 2 + [aseq] * 2), (0, padded_length), value=-1)
    fr = F.pad(
        torch.cat([lfr // chunk_size * 2] * 2 + [afr // chunk_size * 2 + 1] * 2), (0, padded_length), value=-1
    )
    no = F.pad(
        torch.cat([torch.zeros_like(lfr), torch.ones_like(lfr), torch.zeros_like(afr), torch.ones_like(afr)]),
        (0, padded_length),
        value=-1,
    )
    S["self"] = dense_mask(RM.FlexAttnFunc._get_mask_mod(seq, fr, no, window_size), len(seq))
    S["seq"], S["B"] = seq, b


def sdpa(q, k, v):
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    if q.shape[2] == k.shape[2] and "cross" not in S:
        m = S["self"]
    else:  # the flex path's cross mask (_get_cross_mask_mod): own sample's prompt, all positions
        ts = torch.arange(S["B"]).repeat_interleave(k.shape[2] // S["B"])
        m = (S["seq"][:, None] == ts[None]) & (S["seq"][:, None] >= 0)
    has = m.any(-1, keepdim=True)
    return (F.scaled_dot_product_attention(q, k, v, attn_mask=m | ~has) * has).transpose(1, 2)


RM.FlexAttnFunc.init_mask = staticmethod(init_mask)
RM.custom_sdpa = sdpa
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
torch.manual_seed(0)
model = RM.WanTransformer3DModel(**TINY)
g = torch.Generator().manual_seed(100)
with torch.no_grad():
    for _, p in sorted(model.named_parameters()):
        p.add_(0.02 * torch.randn(p.shape, generator=g))
model.save_pretrained(str(OUT / "transformer"), safe_serialization=True)
model = RM.WanTransformer3DModel.from_pretrained(str(OUT / "transformer"), torch_dtype=torch.float32).train()
SLOTS = list(range(7)) + [28]
CASES = {
    "a": dict(seed=1, B=2, views=2, F=4, h=4, w=4, N=4, plen=(7, 3), history=True, chunk=1, window=4),
    "b": dict(seed=2, B=1, views=3, F=5, h=4, w=4, N=3, plen=(11,), history=False, chunk=3, window=10),
}
sv = Sched(shift=5.0, sigma_min=0.0, extra_one_step=True)
sv.set_timesteps(1000, training=True)
sa = Sched(shift=1.0, sigma_min=0.0, extra_one_step=True)
sa.set_timesteps(1000, training=True)


class Host:
    patch_size = (1, 2, 2)
    train_scheduler_latent = sv
    train_scheduler_action = sa
    gradient_accumulation_steps = 1


summary = {
    "reference": "hewu2008/lingbot-va@58c2ae5 model.py + train.py compute_loss, own mask_mods, dense SDPA",
    "torch": torch.__version__,
    "config": TINY,
    "cases": {},
}
for name, c in CASES.items():
    g = torch.Generator().manual_seed(c["seed"])
    B, Fr, h, w, N, C = c["B"], c["F"], c["h"], c["w"], c["N"], 8
    lat = torch.cat([torch.randn(B, C, Fr, h, w, generator=g) for _ in range(c["views"])], dim=-1)
    a8 = torch.rand(B, 8, Fr, N, 1, generator=g) * 3 - 1.5
    act = torch.zeros(B, 30, Fr, N, 1)
    am = torch.zeros(B, 30, Fr, N, 1, dtype=torch.bool)
    for i, s in enumerate(SLOTS):
        act[:, s] = a8[:, i]
        am[:, s] = True
    text = torch.zeros(B, 512, 32)
    tm = torch.zeros(B, 512, dtype=torch.bool)
    for b, n in enumerate(c["plen"]):
        text[b, :n] = torch.randn(n, 32, generator=g)
        tm[b, :n] = True
    inp = {
        "latents": lat,
        "actions": act,
        "actions_mask": am,
        "text_emb": text,
        "text_mask": tm,
        "video_timestep_ids": torch.randint(0, 1000, (Fr,), generator=g),
        "video_noise": torch.randn(lat.shape, generator=g),
        "video_history": torch.tensor(c["history"]),
        "action_timestep_ids": torch.randint(0, 1000, (Fr,), generator=g),
        "action_noise": torch.randn(act.shape, generator=g),
        "chunk_size": torch.tensor(c["chunk"]),
        "window_size": torch.tensor(c["window"]),
    }
    if c["history"]:
        inp["video_history_timestep_ids"] = torch.randint(500, 1000, (Fr,), generator=g)
        inp["video_history_noise"] = torch.randn(lat.shape, generator=g)
    tv = sv.timesteps[inp["video_timestep_ids"]]
    ta = sa.timesteps[inp["action_timestep_ids"]]
    if c["history"]:
        tc = sv.timesteps[inp["video_history_timestep_ids"]]
        clean = sv.add_noise(lat, inp["video_history_noise"], tc, t_dim=2)
    else:
        tc = torch.zeros_like(tv)
        clean = lat
    amf = am.float()
    ld = dict(
        timesteps=tv[None].repeat(B, 1),
        noisy_latents=sv.add_noise(lat, inp["video_noise"], tv, t_dim=2),
        targets=sv.training_target(lat, inp["video_noise"], tv),
        latent=clean,
        cond_timesteps=tc[None].repeat(B, 1),
        grid_id=get_mesh_id(Fr, h // 2, w * c["views"] // 2, t=0, f_w=1, f_shift=0, action=False)[
            None
        ].repeat(B, 1, 1),
        text_emb=text,
    )
    ad = dict(
        timesteps=ta[None].repeat(B, 1),
        noisy_latents=sa.add_noise(act, inp["action_noise"], ta, t_dim=2) * amf,
        targets=sa.training_target(act, inp["action_noise"], ta) * amf,
        latent=act * amf,
        cond_timesteps=torch.zeros_like(ta)[None].repeat(B, 1),
        grid_id=get_mesh_id(Fr, N, 1, t=1, f_w=1, f_shift=0, action=True)[None].repeat(B, 1, 1),
        text_emb=text,
        actions_mask=am,
    )
    model.zero_grad(set_to_none=True)
    d = {"latent_dict": ld, "action_dict": ad, "chunk_size": c["chunk"], "window_size": c["window"]}
    lo, ao = model(d, train_mode=True)
    ll, al = compute_loss(Host(), d, (lo, ao))
    (ll + al).backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    total = torch.nn.utils.clip_grad_norm_(model.parameters(), 2.0)
    exp = {
        "latent_loss": ll.detach().reshape(()),
        "action_loss": al.detach().reshape(()),
        "latent_pred_seq": lo.detach(),
        "action_pred_seq": ao.detach(),
        "total_grad_norm": total.detach().reshape(()),
        **{f"grad.{n}": v for n, v in grads.items()},
    }
    save_file({k: v.contiguous() for k, v in inp.items()}, str(OUT / f"inputs_{name}.safetensors"))
    save_file({k: v.contiguous() for k, v in exp.items()}, str(OUT / f"expected_{name}.safetensors"))
    summary["cases"][name] = {
        "latent_loss": float(ll),
        "action_loss": float(al),
        "total_grad_norm_preclip": float(total),
    }
    print(name, summary["cases"][name])
(OUT / "expected.json").write_text(json.dumps(summary, indent=1))
