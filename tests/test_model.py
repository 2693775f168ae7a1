"""WorldModel (the released LingBot-VA transformer): losses, gradients, determinism, one mask per forward
shared by all blocks, flex == sdpa, activation checkpointing, RoPE, patch order, weighting, FLOPs."""

import pytest
import torch

from tests.support.lingbot_tiny import micro_batch, tiny_cfg
from trainer.config.perf import parse_ac
from trainer.model import WorldModel
from trainer.model.attention import BoundAttention
from trainer.model.masks import SequenceShape, mask_density
from trainer.model.parallel import apply_activation_checkpointing
from trainer.recipe.batch import BatchError
from trainer.recipe.losses import latent_loss

pytestmark = pytest.mark.fast

# The reference never calls the action condition embedder's text projection (it exists in the released
# weights because condition_embedder_action is a deepcopy of condition_embedder): no gradient reaches it.
UNUSED = ("condition_embedder_action.text_embedder.",)


@pytest.fixture(scope="module")
def cfg():
    return tiny_cfg()


def _model(cfg, seed=0):
    torch.manual_seed(seed)
    model = WorldModel(cfg)
    with torch.no_grad():  # released-style norms/biases are not at their init values: make that visible
        for name, p in model.named_parameters():
            if name.endswith(("norm_q.weight", "norm_k.weight", "norm2.weight", "norm2.bias")):
                p.add_(0.1 * torch.randn_like(p))
    return model


def test_forward_returns_losses_and_every_used_parameter_learns(cfg):
    model = _model(cfg)
    out = model(micro_batch(cfg))
    assert set(out) == {"loss", "latent_loss", "action_loss"}
    assert all(v.dim() == 0 and torch.isfinite(v) for v in out.values())
    torch.testing.assert_close(out["loss"], out["latent_loss"] + out["action_loss"])
    assert model.attention_name == "sdpa" and "no backward" in model.attention_reason
    out["loss"].backward()
    silent = [n for n, p in model.named_parameters() if p.grad is None or p.grad.abs().sum() == 0]
    assert silent and all(n.startswith(UNUSED) for n in silent), silent


def test_forward_is_deterministic_given_the_batch(cfg):
    model = _model(cfg)
    batch = micro_batch(cfg, seed=3)
    assert torch.equal(model(batch)["loss"], model(batch)["loss"])


def test_the_prompt_changes_the_prediction_and_padding_matters_only_with_text_mask(cfg):
    model = _model(cfg)
    batch = micro_batch(cfg, seed=1)
    other = dict(batch, text_emb=torch.randn_like(batch["text_emb"]))
    with torch.no_grad():
        a, b = model.predict(batch)["video_tokens"], model.predict(other)["video_tokens"]
    assert not torch.allclose(a, b)
    # changing only padded prompt positions: the reference attends them; model.text_mask ignores them
    padded = batch["text_emb"].clone()
    padded[~batch["text_mask"]] = 5.0
    changed = dict(batch, text_emb=padded)
    with torch.no_grad():
        assert not torch.allclose(model.predict(changed)["video_tokens"], a)
        model.cfg.model.text_mask = True
        try:
            torch.testing.assert_close(
                model.predict(changed)["video_tokens"], model.predict(batch)["video_tokens"]
            )
        finally:
            model.cfg.model.text_mask = False


def test_samples_do_not_see_each_other(cfg):
    """Packing: changing sample 1 (latents, actions, prompt) leaves sample 0's outputs unchanged."""
    model = _model(cfg)
    batch = micro_batch(cfg, seed=2)
    other = dict(batch)
    for key in ("latents", "actions", "text_emb"):
        other[key] = batch[key].clone()
        other[key][1] = torch.randn_like(other[key][1])
    with torch.no_grad():
        a, b = model.predict(batch), model.predict(other)
    torch.testing.assert_close(a["video_tokens"][0], b["video_tokens"][0])
    torch.testing.assert_close(a["action_tokens"][0], b["action_tokens"][0])
    assert not torch.allclose(a["video_tokens"][1], b["video_tokens"][1])


def test_one_mask_per_forward_shared_by_all_blocks(cfg):
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
    model(micro_batch(cfg))
    assert len(built) == 1 and len(seen) == cfg.model.depth
    assert all(isinstance(a, BoundAttention) and a is seen[0] for a in seen)


def test_flex_and_sdpa_give_the_same_outputs(cfg):
    batch = micro_batch(cfg, seed=4)
    outs = {}
    for name in ("sdpa", "flex"):
        model = _model(cfg)
        model.set_attention_backend(name, compiled=False)  # eager flex forward runs on CPU; no backward there
        with torch.no_grad():
            outs[name] = model.predict(batch)
    for key in ("video_tokens", "action_tokens"):
        torch.testing.assert_close(outs["flex"][key], outs["sdpa"][key], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("choice", ["full", "op", "block:2"])
def test_activation_checkpointing_keeps_loss_and_gradients(cfg, choice):
    batch = micro_batch(cfg, seed=5)
    plain, ckpt = _model(cfg), _model(cfg)
    apply_activation_checkpointing(ckpt, parse_ac(choice))
    wrapped = ["CheckpointWrapper" in type(b).__name__ for b in ckpt.blocks]
    assert wrapped == ([True, False] if choice == "block:2" else [True, True])
    a, b = plain(batch)["loss"], ckpt(batch)["loss"]
    a.backward()
    b.backward()
    torch.testing.assert_close(a, b)
    grads_a = {n: p.grad for n, p in plain.named_parameters()}
    for name, p in ckpt.named_parameters():
        g = grads_a[name.replace("_checkpoint_wrapped_module.", "")]
        if g is None:
            assert p.grad is None
        else:
            torch.testing.assert_close(p.grad, g)


def test_a_few_steps_on_one_batch_lower_both_losses(cfg):
    model = _model(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    batch = micro_batch(cfg, seed=6)
    first = model(batch)
    for _ in range(30):
        out = model(batch)
        opt.zero_grad()
        out["loss"].backward()
        opt.step()
    last = model(batch)
    assert last["latent_loss"] < 0.7 * first["latent_loss"]
    assert last["action_loss"] < 0.7 * first["action_loss"]


def test_reference_rope_positions(cfg):
    """Video (frame, row, col); the j-th of N actions of frame f at (f + (j+1)/(N+1), -1, -1)."""
    model = _model(cfg)
    rows, cols, f, n = 2, 4, cfg.data.frames, cfg.data.actions_per_frame
    pos = model._positions(1, f, rows, cols, 0, torch.device("cpu"))
    video = f * rows * cols
    assert pos.shape == (2 * video + 2 * f * n, 3)
    assert pos[rows * cols + cols + 1].tolist() == [1.0, 1.0, 1.0]  # frame 1, row 1, col 1
    actions = pos[2 * video : 2 * video + f * n]
    torch.testing.assert_close(actions[n + 1], torch.tensor([1 + 2 / (n + 1), -1.0, -1.0]))
    assert not (actions[:, None, :] == pos[None, :video, :]).all(-1).any()  # no action sits on a video token
    model.cfg.recipe.action_rope = "aligned"
    try:
        model._positions.cache_clear()
        aligned = model._positions(1, f, rows, cols, 0, torch.device("cpu"))[2 * video]
        assert aligned.tolist() == [0.0, 0.0, 0.0]  # the old layout: on the video token at row 0, col 0
    finally:
        model.cfg.recipe.action_rope = "reference"
        model._positions.cache_clear()


def test_patchify_order_and_output_layout(cfg):
    """Input patches are (c, p, p); proj_out features are (p, p, c), as the reference's rearranges."""
    model = _model(cfg)
    x = torch.arange(1 * 1 * 2 * 2 * 4, dtype=torch.float32).reshape(1, 1, 2, 2, 4)  # B F C H W
    tokens = model._patchify(x)
    assert tokens.shape == (1, 2, 8)
    assert tokens[0, 0].tolist() == [0, 1, 4, 5, 8, 9, 12, 13]  # channel 0's 2x2 patch, then channel 1's
    out = torch.stack([x[0, 0, :, :, 0:2], x[0, 0, :, :, 2:4]]).permute(0, 2, 3, 1).reshape(1, 2, 8)
    torch.testing.assert_close(model._unpatchify(out, x.shape), x)


def test_loss_weighting_follows_the_recipe(cfg):
    model = _model(cfg)
    batch = micro_batch(cfg, seed=7)
    with torch.no_grad():
        weighted = model(batch)["latent_loss"]
        out = model.predict(batch)
    assert not torch.isclose(weighted, latent_loss(out["pred_video"], out["target_video"]))
    model.cfg.recipe.loss_weighting = "none"
    try:
        with torch.no_grad():
            torch.testing.assert_close(
                model(batch)["latent_loss"], latent_loss(out["pred_video"], out["target_video"])
            )
    finally:
        model.cfg.recipe.loss_weighting = "reference"


def test_a_batch_breaking_the_contract_is_rejected_naming_the_key(cfg):
    batch = micro_batch(cfg)
    batch["actions"] = batch["actions"][:, :-1]
    with pytest.raises(BatchError, match="'actions'"):
        _model(cfg)(batch)
    batch = micro_batch(cfg)
    del batch["text_emb"]
    with pytest.raises(BatchError, match="missing key 'text_emb'"):
        _model(cfg)(batch)


def test_flops_per_token_by_hand(cfg):
    model = _model(cfg)
    d, depth, ffn = 48, 2, 96
    per_block = 4 * d * d + 2 * d * d + 2 * d * ffn  # self q k v out, cross q out, MLP
    rows = cfg.model.latent_size // cfg.model.patch
    s = SequenceShape(frames=4, tokens_per_frame=rows * rows, actions_per_frame=3)
    share = s.video_tokens / (s.video_tokens + s.action_tokens)
    embed = share * 16 * d + (1 - share) * 30 * d
    heads = 0.5 * (share * d * 16 + (1 - share) * d * 30)
    keys = mask_density(s, 2, 2, 34) + 512
    expected = 3 * (2 * (depth * per_block + embed + heads) + 4 * d * keys * depth)
    assert model.flops_per_token() == pytest.approx(expected)
