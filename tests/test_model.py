"""WorldModel: losses, determinism, one mask per forward shared by all blocks, flex == sdpa, FLOPs."""

import pytest
import torch

from trainer.attention import BoundAttention
from trainer.config import RunConfig, apply_overrides
from trainer.data import build_stream
from trainer.data.generate import generate_dataset
from trainer.masks import mask_density, sequence_shape
from trainer.model import WorldModel
from trainer.parallel import apply_activation_checkpointing


def tiny_cfg(path):
    cfg = RunConfig()
    apply_overrides(
        cfg,
        {
            "data.path": str(path),
            "data.frames": 4,
            "data.frames_per_chunk": 1,
            "data.window": 2,
            "model.latent_size": 8,
            "model.latent_channels": 4,
            "model.dim": 32,
            "model.depth": 3,
            "model.heads": 2,
            "model.attn_block": 32,
            "train.batch_size": 2,
            "train.grad_accum": 2,
        },
        "test",
    )
    cfg.validate()
    return cfg


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("fb") / "ds"
    generate_dataset(root, 3, 20, "one_leg", seed=1)
    cfg = tiny_cfg(root)
    return cfg, build_stream(cfg, 0, 1)


def _model(cfg, seed=0):
    torch.manual_seed(seed)
    return WorldModel(cfg)


def test_forward_returns_losses_and_every_parameter_learns(setup):
    cfg, stream = setup
    model = _model(cfg)
    out = model(stream.micro_batch(0, 0))
    assert set(out) == {"loss", "latent_loss", "action_loss"}
    assert all(v.dim() == 0 and torch.isfinite(v) for v in out.values())
    torch.testing.assert_close(out["loss"], out["latent_loss"] + out["action_loss"])
    assert model.attention_name == "sdpa" and "no backward" in model.attention_reason
    out["loss"].backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or p.grad.abs().sum() == 0]
    assert not missing


def test_forward_is_deterministic_given_the_batch(setup):
    cfg, stream = setup
    model = _model(cfg)
    batch = stream.micro_batch(3, 1)
    assert torch.equal(model(batch)["loss"], model(batch)["loss"])


def test_one_mask_per_forward_shared_by_all_blocks(setup):
    cfg, stream = setup
    model = _model(cfg)
    backend = model._backend_for(torch.device("cpu"))
    built, seen = [], []
    original = backend.build_mask

    def counting_build(*args, **kwargs):
        built.append(1)
        return original(*args, **kwargs)

    backend.build_mask = counting_build
    for block in model.blocks:
        block.register_forward_pre_hook(lambda mod, args: seen.append(args[4]))
    model(stream.micro_batch(0, 0))
    assert len(built) == 1 and len(seen) == cfg.model.depth
    assert all(isinstance(a, BoundAttention) and a is seen[0] for a in seen)


def test_flex_and_sdpa_give_the_same_losses(setup):
    cfg, stream = setup
    batch = stream.micro_batch(1, 0)
    losses = {}
    for name in ("sdpa", "flex"):
        model = _model(cfg)
        model.set_attention_backend(name, compiled=False)  # eager flex forward runs on CPU; no backward there
        with torch.no_grad():
            losses[name] = model(batch)
    for key in ("latent_loss", "action_loss"):
        torch.testing.assert_close(losses["flex"][key], losses["sdpa"][key], rtol=1e-5, atol=1e-6)


def test_activation_checkpointing_keeps_loss_and_gradients(setup):
    cfg, stream = setup
    batch = stream.micro_batch(2, 0)
    plain, ckpt = _model(cfg), _model(cfg)
    apply_activation_checkpointing(ckpt)
    a, b = plain(batch)["loss"], ckpt(batch)["loss"]
    a.backward()
    b.backward()
    torch.testing.assert_close(a, b)
    grads_a = {n.replace("_checkpoint_wrapped_module.", ""): p.grad for n, p in plain.named_parameters()}
    for name, p in ckpt.named_parameters():
        torch.testing.assert_close(p.grad, grads_a[name.replace("_checkpoint_wrapped_module.", "")])


def test_a_few_steps_on_one_batch_lower_both_losses(setup):
    cfg, stream = setup
    model = _model(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    batch = stream.micro_batch(0, 0)
    first = model(batch)
    for _ in range(30):
        out = model(batch)
        opt.zero_grad()
        out["loss"].backward()
        opt.step()
    last = model(batch)
    assert last["latent_loss"] < 0.7 * first["latent_loss"]
    assert last["action_loss"] < 0.7 * first["action_loss"]


def test_wrong_clip_length_is_rejected(setup):
    cfg, stream = setup
    batch = dict(stream.micro_batch(0, 0))
    batch["latents"] = batch["latents"][:, :2]
    with pytest.raises(ValueError, match="built for 4 frames"):
        _model(cfg)(batch)


def test_flops_per_token_by_hand(setup):
    cfg, _ = setup
    model = _model(cfg)
    d, depth, hidden = 32, 3, 128
    per_block = 3 * d * d + d * d + 2 * d * hidden
    video, action = 4 * 16, 4 * 2  # tokens per sample
    share = video / (video + action)
    embed = share * 16 * d + (1 - share) * 30 * d
    heads = 0.5 * (share * d * 16 + (1 - share) * d * 30)
    keys = mask_density(sequence_shape(cfg), 2, 1, 2)
    expected = 3 * (2 * (depth * per_block + embed + heads) + 4 * d * keys * depth)
    assert model.flops_per_token() == pytest.approx(expected)
    assert 0 < keys < 2 * (video + action)  # the mask is sparse: far fewer keys than the packed length
