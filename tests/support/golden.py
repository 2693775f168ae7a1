"""Golden parity with the upstream reference: read its golden run, make our batches, write our fixture.

The parity run (outside this tree: tests/support/reference_golden.py run by the upstream install's
Python, docs/model.md "Parity with the upstream reference" has the commands) saved, in $LINGBOT_GOLDEN_DIR
(no default: a folder only the machine that made it has):
    transformer/{config.json, diffusion_pytorch_model.safetensors}   save_pretrained of a seeded tiny model
    inputs_<case>.safetensors    the batch in the reference's layout + every random draw (timestep ids, noise)
    expected_<case>.safetensors  its forward_train outputs, losses, total grad norm, every parameter's grad
    expected.json                the same scalars, the configs, provenance
`python -m tests.support.golden` (our code: our loader reads the folder, our conversion makes our batches)
writes tests/fixtures/golden_parity.{safetensors,json}: the tiny model's weights as our model holds them, our
micro-batches, and the reference's expected numbers (losses, predictions, grad norms), so the committed test
runs without the upstream code.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from trainer.config import RunConfig
from trainer.model import WorldModel, apply_pretrained_config, load_full
from trainer.recipe.draws import sigma_table

# where the parity run's files are; None (the live checks skip, saying how to make them) when unset
GOLDEN = Path(os.environ["LINGBOT_GOLDEN_DIR"]) if os.environ.get("LINGBOT_GOLDEN_DIR") else None
# what makes an outside upstream install and a golden run (docs/model.md has the same commands)
PARITY_SETUP = (
    "see docs/model.md 'Parity with the upstream reference': make the upstream install at "
    "$LINGBOT_PARITY_DIR, then `PYTHONPATH=. $LINGBOT_PARITY_DIR/venv/bin/python "
    "tests/support/reference_golden.py DIR` and set LINGBOT_GOLDEN_DIR=DIR"
)
# the fixture's provenance: what anyone reruns to get the same numbers (no folder of one machine)
PROVENANCE = {
    "upstream": "https://github.com/hewu2008/lingbot-va",
    "commit": "58c2ae5",
    "what": "wan_va/modules/model.py (forward_train's bf16 input casts made fp32) + train.py "
    "Trainer.compute_loss, masks from its own mask_mods evaluated densely for SDPA",
    "setup": "docs/model.md 'Parity with the upstream reference' (the upstream install at "
    "$LINGBOT_PARITY_DIR)",
    "command": 'PYTHONPATH=. "$LINGBOT_PARITY_DIR/venv/bin/python" tests/support/reference_golden.py DIR && '
    "LINGBOT_GOLDEN_DIR=DIR .venv/bin/python -m tests.support.golden",
}
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
FIXTURE_TENSORS = FIXTURES / "golden_parity.safetensors"
FIXTURE_JSON = FIXTURES / "golden_parity.json"
PICKED_GRADS = (
    "patch_embedding_mlp.weight",
    "action_embedder.weight",
    "condition_embedder.time_proj.weight",
    "condition_embedder_action.time_proj.weight",
    "condition_embedder.text_embedder.linear_1.weight",
    "blocks.0.attn1.to_q.weight",
    "blocks.0.attn2.to_k.weight",
    "blocks.1.ffn.net.2.weight",
    "blocks.1.scale_shift_table",
    "proj_out.weight",
    "action_proj_out.weight",
    "scale_shift_table",
)


def golden_cases(golden: Path | None = GOLDEN) -> list[str]:
    if golden is None:
        return []
    return sorted(p.stem[len("inputs_") :] for p in golden.glob("inputs_*.safetensors"))


def model_cfg(actions_per_frame: int, pretrained: Path | str = "") -> RunConfig:
    """fp32, SDPA, the reference's recipe; dims from the golden config.json when `pretrained` is given."""
    cfg = RunConfig()
    cfg.model.pretrained = str(pretrained)
    cfg.model.attention = "sdpa"
    cfg.data.actions_per_frame = actions_per_frame
    apply_pretrained_config(cfg)
    return cfg


def batch_from_reference(inputs: dict[str, torch.Tensor], recipe) -> dict[str, torch.Tensor]:
    """The reference's batch + draws ([B, C, F, H, W] latents, [B, 30, F, N, 1] actions, timestep ids into its
    1000-step grids) -> our micro-batch (trainer/recipe/batch.py)."""
    steps = recipe.num_train_timesteps
    lat = inputs["latents"].permute(0, 2, 1, 3, 4).contiguous()
    b, f = lat.shape[:2]

    def actions(x: torch.Tensor) -> torch.Tensor:  # [B, A, F, N, 1] -> [B, F*N, A]
        return x[..., 0].permute(0, 2, 3, 1).reshape(b, -1, x.shape[1]).contiguous()

    def sigmas(ids: torch.Tensor, shift: float) -> torch.Tensor:
        return sigma_table(shift, steps)[ids.long()].expand(b, f).contiguous()

    history = bool(inputs["video_history"])
    batch = {
        "latents": lat,
        "actions": actions(inputs["actions"]),
        "action_mask": actions(inputs["actions_mask"]),
        "text_emb": inputs["text_emb"],
        "text_mask": inputs["text_mask"].bool(),
        "latent_sigma": sigmas(inputs["video_timestep_ids"], recipe.video_shift),
        "latent_noise": inputs["video_noise"].permute(0, 2, 1, 3, 4).contiguous(),
        "action_sigma": sigmas(inputs["action_timestep_ids"], recipe.action_shift),
        "action_noise": actions(inputs["action_noise"]),
        "frames_per_chunk": inputs["chunk_size"].long(),
        "window": inputs["window_size"].long(),
        "text_dropped": torch.zeros(b, dtype=torch.bool),
    }
    if history:
        batch["history_sigma"] = sigmas(inputs["video_history_timestep_ids"], recipe.video_shift)
        batch["history_noise"] = inputs["video_history_noise"].permute(0, 2, 1, 3, 4).contiguous()
    else:
        batch["history_sigma"] = torch.zeros(b, f)
        batch["history_noise"] = torch.zeros_like(lat)
    return batch


def run_ours(model: WorldModel, batch: dict) -> dict[str, torch.Tensor]:
    """Our forward + loss + backward: losses, raw predictions, grads, the pre-clip total grad norm."""
    model.zero_grad(set_to_none=True)
    out = model(batch)
    out["loss"].backward()
    with torch.no_grad():
        pred = model.predict(batch)
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    total = torch.linalg.vector_norm(torch.stack([g.norm() for g in grads.values()]))
    return {
        "latent_loss": out["latent_loss"],
        "action_loss": out["action_loss"],
        "video_tokens": pred["video_tokens"],
        "action_tokens": pred["action_tokens"],
        "total_grad_norm": total,
        **{f"grad.{n}": g for n, g in grads.items()},
    }


def reference_video_tokens(expected: torch.Tensor, ours_shape: torch.Size) -> torch.Tensor:
    """The reference's latent output [B, L*p*p, C] ('(l n) c') as our [B, L, p*p*C] ('l (n c)')."""
    return expected.reshape(ours_shape)


def write_fixture(golden: Path | None = GOLDEN) -> None:
    if golden is None:
        raise SystemExit(f"LINGBOT_GOLDEN_DIR is not set: {PARITY_SETUP}")
    from safetensors.torch import load_file, save_file

    summary = json.loads((golden / "expected.json").read_text())
    tensors: dict[str, torch.Tensor] = {}
    cases = {}
    for name in golden_cases(golden):
        inputs = load_file(golden / f"inputs_{name}.safetensors")
        expected = load_file(golden / f"expected_{name}.safetensors")
        n = int(inputs["actions"].shape[3])
        cfg = model_cfg(n, golden / "transformer")
        model = WorldModel(cfg)
        load_full(model, golden / "transformer")
        if not any(k.startswith("weight.") for k in tensors):
            tensors.update({f"weight.{k}": v.detach().clone() for k, v in model.state_dict().items()})
        batch = batch_from_reference(inputs, cfg.recipe)
        ours = run_ours(model, batch)
        tensors.update({f"{name}.batch.{k}": v.contiguous() for k, v in batch.items()})
        tensors[f"{name}.expected.video_tokens"] = reference_video_tokens(
            expected["latent_pred_seq"], ours["video_tokens"].shape
        ).contiguous()
        tensors[f"{name}.expected.action_tokens"] = expected["action_pred_seq"].contiguous()
        cases[name] = {
            "actions_per_frame": n,
            "latent_loss": float(expected["latent_loss"]),
            "action_loss": float(expected["action_loss"]),
            "total_grad_norm_preclip": float(expected["total_grad_norm"]),
            "grad_norms": {k: float(expected[f"grad.{k}"].norm()) for k in PICKED_GRADS},
            "ours_at_generation": {
                "latent_loss": float(ours["latent_loss"]),
                "action_loss": float(ours["action_loss"]),
                "total_grad_norm": float(ours["total_grad_norm"]),
            },
        }
    config = json.loads((golden / "transformer" / "config.json").read_text())
    FIXTURES.mkdir(exist_ok=True)
    save_file(tensors, str(FIXTURE_TENSORS))
    FIXTURE_JSON.write_text(
        json.dumps(
            {
                "about": "golden values of the upstream LingBot-VA (58c2ae5) forward_train + compute_loss, "
                "fp32, CPU, SDPA, tiny seeded model; weights and batches re-saved by tests/support/golden.py",
                "reference": PROVENANCE,
                "reference_torch": summary.get("torch"),
                "reference_diffusers": summary.get("diffusers"),
                "config_json": {k: v for k, v in config.items() if not k.startswith("_")},
                "cases": cases,
            },
            indent=1,
            sort_keys=True,
        )
        + "\n"
    )


if __name__ == "__main__":
    write_fixture()
    print(f"wrote {FIXTURE_TENSORS} ({FIXTURE_TENSORS.stat().st_size} bytes) and {FIXTURE_JSON}")
