"""Action inference (trainer/sampling/, trainer/model/kv_cache.py, streaming.py) and open-loop evaluation
(trainer/evaluation/):
the schedule, the cache's keep/evict/drop rules, cached == recomputed history, first-chunk conditioning,
zeroed unused channels, guidance rows (action guidance without video guidance works), bin/evaluate's
targets, a DCP checkpoint loaded unsharded, and the evaluation's counts and determinism."""

import json

import click
import numpy as np
import pytest
import torch

from tests.support.lingbot_tiny import VIEWS, tiny_cfg
from trainer.config import InferConfig, load_config
from trainer.data.normalize import QuantileNormalizer
from trainer.evaluation.cli import held_out, scores_failure
from trainer.evaluation.openloop import Episode, evaluate_open_loop
from trainer.model import WorldModel
from trainer.model.kv_cache import LayerKVCache
from trainer.recipe.batch import ACTION_SLOTS, action_slot_mask
from trainer.sampling.load import TargetError, check_named_config, load_model, resolve_target
from trainer.sampling.sampler import ChunkSampler
from trainer.sampling.scheduler import FlowSchedule

pytestmark = pytest.mark.fast
F, TEXT = 2, 5


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    m = WorldModel(tiny_cfg()).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return m


def _sampler(model, **infer):
    icfg = InferConfig(**{"frames_per_chunk": F, "video_steps": 3, "action_steps": 3, **infer})
    g = torch.Generator().manual_seed(1)
    text = torch.randn(2, TEXT, model.cfg.model.text_dim, generator=g)
    mask = action_slot_mask(model.cfg.model.action_dim, len(ACTION_SLOTS))
    m = model.cfg.model
    grid = (m.latent_channels, m.latent_size, m.latent_size * VIEWS)
    return ChunkSampler(model, icfg, mask, text[0], text[1], video_grid=grid)


def _session(sampler, chunks=2, seed=5):
    g = torch.Generator().manual_seed(seed)
    c, h, w = sampler.grid
    n, a = sampler.model.apf, sampler.mask.numel()
    real = torch.randn(chunks * F, c, h, w, generator=g)
    acts = torch.randn(chunks * F * n, a, generator=g).clamp(-1.5, 1.5)
    out = []
    for k in range(chunks):
        noise = torch.randn(F, c, h, w, generator=g), torch.randn(F * n, a, generator=g)
        out.append(sampler.sample(real[0] if k == 0 else None, *noise))
        if k + 1 < chunks:
            sampler.observe(real[k * F : (k + 1) * F], acts[k * F * n : (k + 1) * F * n])
    return real, out


def test_schedule_is_the_shifted_linear_grid_then_the_cache_pass():
    s = FlowSchedule.make(4, 5.0)
    base = torch.tensor([1.0, 0.75, 0.5, 0.25])
    torch.testing.assert_close(s.sigmas, 5 * base / (1 + 4 * base))
    assert s.loop_timesteps() == [*(1000 * s.sigmas).tolist(), 0.0]
    assert s.loop_timesteps(3) == (1000 * s.sigmas).tolist()[:3]
    x, v = torch.ones(3), torch.full((3,), 2.0)
    torch.testing.assert_close(s.step(v, 3, x), x + v * (0 - s.sigmas[3]))


def test_cache_keeps_real_and_predicted_drops_predicted_and_evicts_the_oldest():
    cache = LayerKVCache(rows=1, capacity=6, heads=1, head_dim=2, dtype=torch.float32, device="cpu")

    def call(n, keep, value):
        cache.keep = keep
        q = torch.zeros(1, 1, n, 2)
        k = torch.full((1, 1, n, 2), float(value))
        return cache.attend(q, k, k)

    call(2, "real", 1.0)
    assert cache.tokens() == 2
    out = call(3, "none", 3.0)  # attends the 2 kept + itself (uniform: q = 0), then released
    torch.testing.assert_close(out, torch.full_like(out, (2 * 1 + 3 * 3) / 5))
    assert cache.tokens() == 2
    call(2, "pred", 5.0)
    assert cache.tokens() == 4 and int(cache.predicted[cache.used].sum()) == 2
    cache.drop_predicted()
    assert cache.tokens() == 2
    call(3, "real", 7.0)
    out = call(2, "none", 9.0)  # 5 in use + 2 > 6: one slot of the oldest write (value 1) goes, for good
    torch.testing.assert_close(out, torch.full_like(out, (1 * 1 + 3 * 7 + 2 * 9) / 6))
    assert cache.tokens() == 4
    with pytest.raises(ValueError, match="exceed its capacity"):
        call(7, "none", 0.0)


def test_cached_history_equals_recomputed_history(model):
    _, cached = _session(_sampler(model))
    _, recomputed = _session(_sampler(model, kv_cache=False))
    for a, b in zip(cached, recomputed, strict=True):
        torch.testing.assert_close(a.latents, b.latents, rtol=0, atol=1e-5)
        torch.testing.assert_close(a.actions, b.actions, rtol=0, atol=1e-5)


def test_first_chunk_is_conditioned_and_unused_channels_are_zero(model):
    sampler = _sampler(model)
    real, (c0, c1) = _session(sampler)
    n = model.apf
    torch.testing.assert_close(c0.latents[0], real[0])
    assert (c0.actions[:n] == 0).all() and (c1.actions[:n] != 0).any()
    unused = ~sampler.mask
    assert (c0.actions[:, unused] == 0).all() and (c1.actions[:, unused] == 0).all()
    assert (c0.frame_start, c1.frame_start) == (0, F)
    assert not torch.allclose(c1.latents[0], real[F])


def test_predicted_entries_are_dropped_when_observations_arrive(model):
    sampler = _sampler(model)
    c, h, w = sampler.grid
    sampler.sample(torch.zeros(c, h, w))
    per_chunk = sampler.video_tokens + sampler.action_tokens
    assert sampler.cache.tokens() == per_chunk  # the two t = 0 passes, predicted
    sampler.observe(torch.zeros(F, c, h, w), torch.zeros(F * model.apf, sampler.mask.numel()))
    layer = sampler.cache.layers[0]
    assert sampler.cache.tokens() == per_chunk and not layer.predicted[layer.used].any()


def test_action_guidance_without_video_guidance_runs_two_rows(model):
    plain, guided = _sampler(model, guidance=1.0), _sampler(model, guidance=1.0, action_guidance=3.0)
    assert (plain.rows, guided.rows) == (1, 2)
    _, a = _session(plain)
    _, b = _session(guided)
    torch.testing.assert_close(a[0].latents, b[0].latents, rtol=0, atol=1e-5)  # row 0 is the same video
    assert not torch.allclose(a[0].actions, b[0].actions, atol=1e-3)


def _episodes(model, count=2, frames=5):
    g = torch.Generator().manual_seed(9)
    m, n = model.cfg.model, model.apf
    mask = action_slot_mask(m.action_dim, len(ACTION_SLOTS))
    return [
        Episode(
            f"ep{i}",
            torch.randn(frames, m.latent_channels, m.latent_size, m.latent_size * VIEWS, generator=g),
            torch.randn(frames * n, m.action_dim, generator=g).clamp(-1.5, 1.5) * mask,
        )
        for i in range(count)
    ]


def test_open_loop_evaluation_counts_and_is_reproducible(model):
    norm = QuantileNormalizer(
        np.linspace(-1, 0, 8).astype(np.float32), np.linspace(1, 3, 8).astype(np.float32)
    )
    eps = _episodes(model)
    first = evaluate_open_loop(_sampler(model), eps, ACTION_SLOTS, norm, seed=3)
    again = evaluate_open_loop(_sampler(model), eps, ACTION_SLOTS, norm, seed=3)
    assert first == again
    o = first["overall"]
    # 5 frames, chunks of 2: two chunks per episode, 1 + 2 predicted frames, 1 frame left over
    assert (o["chunks"], o["frames"], o["frames_skipped"]) == (4, 6, 2)
    assert o["actions"] == 6 * model.apf
    assert set(o["groups"]) == {"position", "rotation", "gripper"} and o["latent_mse"] > 0
    span = (norm.q99 - norm.q01) / 2  # robot error = normalised error x half the quantile span, per channel
    for i, (name, v) in enumerate(o["per_channel"].items()):
        assert v["mae_robot"] == pytest.approx(v["mae_norm"] * span[i], rel=1e-4), name
    assert evaluate_open_loop(_sampler(model), eps, ACTION_SLOTS, norm, seed=4) != first
    assert scores_failure(first, F) == ""


def test_nothing_predicted_or_no_episode_named_is_never_a_score(model):
    """Found by running it: episodes shorter than one chunk (or `--episodes ,`, which named none) scored
    action MAE 0.0, a perfect score, and bin/evaluate exited 0 having predicted nothing."""
    norm = QuantileNormalizer(np.full(8, -1, np.float32), np.ones(8, np.float32))
    short = evaluate_open_loop(_sampler(model), _episodes(model, frames=F - 1), ACTION_SLOTS, norm)
    assert short["overall"]["actions"] == 0 and short["overall"]["action_mae_norm"] == 0.0
    assert scores_failure(short, F) == (
        f"no action was predicted: 2 episode(s), {2 * (F - 1)} latent frame(s) left over, none a whole "
        f"chunk of infer.frames_per_chunk={F}"
    )
    nothing = evaluate_open_loop(_sampler(model), [], ACTION_SLOTS, norm)
    assert scores_failure(nothing, F).startswith("no action was predicted: 0 episode(s)")
    cfg = tiny_cfg()
    for requested in ("", ",", " , "):
        with pytest.raises(click.BadParameter, match="names no episode"):
            held_out(["a", "b"], cfg, requested)
    assert held_out(["a", "b"], cfg, "b, a")[0] == ["b", "a"]
    cfg.data.val_episodes = 1.0  # as a checkpoint's config.json gives the count back
    with pytest.raises(click.BadParameter, match="--episodes names a more than once; name each once"):
        held_out(["a", "b"], cfg, "a,b,a")  # a review: scored twice, into one plot and one entry
    banner = held_out(["a", "b", "c"], cfg, None)[1]
    assert banner.endswith("1 held-out episode(s) of 3 (data.val_episodes=1)")


def test_evaluate_targets_are_named_in_errors(tmp_path):
    with pytest.raises(TargetError, match="no such directory"):
        resolve_target(tmp_path / "missing")
    (tmp_path / "model.safetensors").write_bytes(b"")  # a file given for the folder that holds it
    with pytest.raises(
        TargetError, match=r"model\.safetensors: a file, not a directory \(expected a run dir"
    ):
        resolve_target(tmp_path / "model.safetensors")
    with pytest.raises(TargetError, match=r"neither a run dir"):
        resolve_target(tmp_path)
    (tmp_path / "checkpoints").mkdir()
    with pytest.raises(TargetError, match="no complete checkpoint"):
        resolve_target(tmp_path)


def test_a_run_dir_means_its_best_checkpoint_else_its_newest_complete_one(tmp_path):
    """bin/evaluate and bin/serve take RUN_DIR as checkpoints/best when that points at a complete
    checkpoint; otherwise (no pointer, or one at a partial checkpoint) the newest complete one."""
    root = tmp_path / "checkpoints"
    for step in (5, 7, 9):
        ckpt = root / f"checkpoint_step_{step}"
        ckpt.mkdir(parents=True)
        (ckpt / "train_state.json").write_text(json.dumps({"step": step}))
        if step != 9:  # step 9 is partial: no COMPLETE marker
            files = {p.name: p.stat().st_size for p in ckpt.iterdir()}
            (ckpt / "COMPLETE").write_text(json.dumps({"step": step, "files": files}))
    assert resolve_target(tmp_path) == ("checkpoint", root / "checkpoint_step_7")
    (root / "best").symlink_to("checkpoint_step_5")
    assert resolve_target(tmp_path) == ("checkpoint", (root / "checkpoint_step_5").resolve())
    (root / "best").unlink()
    (root / "best").symlink_to("checkpoint_step_9")  # damaged since (a review: step 7 was used, unsaid)
    with pytest.raises(
        TargetError, match=r"best points at .*checkpoint_step_9, which is not a complete check"
    ):
        resolve_target(tmp_path)
    assert resolve_target(root / "checkpoint_step_7") == ("checkpoint", root / "checkpoint_step_7")


def test_a_dcp_checkpoint_loads_into_a_plain_model(tmp_path, model):
    import torch.distributed.checkpoint as dcp

    ckpt = tmp_path / "checkpoints" / "checkpoint_step_7"
    ckpt.mkdir(parents=True)
    dcp.save({"train": {"model": model.state_dict()}}, checkpoint_id=str(ckpt), no_dist=True)
    (ckpt / "train_state.json").write_text(json.dumps({"step": 7, "config": model.cfg.to_dict()}))
    files = {p.name: p.stat().st_size for p in ckpt.iterdir()}
    (ckpt / "COMPLETE").write_text(json.dumps({"step": 7, "files": files}))
    loaded, cfg, what = load_model(tmp_path, None)
    assert "checkpoint_step_7" in what and cfg.model.dim == model.cfg.model.dim
    # --config names a reference folder's config; a checkpoint's own was used whatever it said (unsaid)
    check_named_config(tmp_path, None)
    check_named_config(tmp_path, cfg.name)
    with pytest.raises(TargetError, match=f"--config robotwin: .* is a checkpoint of a '{cfg.name}' run"):
        check_named_config(tmp_path, "robotwin")
    # so were --cpu-scale/--full-scale: a scale flag whose model is not the checkpoint's is refused, naming it
    scale = rf"--cpu-scale: .* not {cfg.name}'s CPU scale: model.dim=48 \(not 128\)"
    with pytest.raises(TargetError, match=scale):
        check_named_config(tmp_path, None, True)
    with pytest.raises(TargetError, match=r"--full-scale: .*model.dim=48 \(not 3072\).*drop --full-scale"):
        check_named_config(tmp_path, cfg.name, False)
    cpu = tmp_path / "cpu-scale" / "checkpoint_step_3"  # a checkpoint of the preset's own CPU scale
    cpu.mkdir(parents=True)
    (cpu / "train_state.json").write_text(
        json.dumps({"step": 3, "config": load_config(cfg.name, cpu_scale=True).to_dict()})
    )
    (cpu / "COMPLETE").write_text(json.dumps({"step": 3, "files": {"train_state.json": 0}}))
    check_named_config(cpu, None, True)
    with pytest.raises(TargetError, match="--full-scale: .* not furniture_train's full scale: model.dim=128"):
        check_named_config(cpu, None, False)
    for (name, a), b in zip(model.state_dict().items(), loaded.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    # the name check reads train_state.json only; the load's own check reads every file (one full read)
    with open(next(ckpt.glob("*.distcp")), "ab") as shard:
        shard.write(b"x")
    check_named_config(ckpt, cfg.name)
    with pytest.raises(TargetError, match="damaged"):
        resolve_target(ckpt)


def test_a_checkpoint_is_never_scored_or_served_with_statistics_it_was_not_trained_with(tmp_path):
    """Found by a review: the action statistics were fitted again from whatever the dataset held at
    evaluation or serving time (an episode added since rescaled every served action, unsaid). A checkpoint
    records them (train_state.json "data_stats"); others are refused naming the first difference; a
    checkpoint from before they were recorded is said, not refused."""
    import numpy as np

    from trainer.data.normalize import MeanStdNormalizer, QuantileNormalizer, stats_record
    from trainer.sampling.load import check_trained_stats

    trained = QuantileNormalizer(np.array([-1.0, 0.0], np.float32), np.array([1.0, 2.0], np.float32))
    latents = (np.zeros((4, 1, 1)), np.ones((4, 1, 1)))
    ckpt = tmp_path / "checkpoints" / "checkpoint_step_2"
    ckpt.mkdir(parents=True)
    state = {"step": 2, "config": tiny_cfg().to_dict(), "data_stats": stats_record(trained, latents)}
    target = ckpt / "train_state.json"
    target.write_text(json.dumps(state))
    (ckpt / "COMPLETE").write_text(json.dumps({"step": 2, "files": {target.name: target.stat().st_size}}))
    said: list[str] = []
    check_trained_stats(tmp_path, trained, latents, "the dataset D", said.append)  # the same: silent
    assert said == []
    wider = QuantileNormalizer(np.array([-1.0, -0.5], np.float32), np.array([1.0, 2.0], np.float32))
    for normalizer, stats, diff in (
        (wider, latents, r"actions q01\[1\] was 0 in training, is -0.5 now"),
        (MeanStdNormalizer(trained.q01, trained.q99), latents, r"actions: trained with \['q01', 'q99'\]"),
        (trained, (np.zeros(4), 2 * np.ones(4)), r"latents std\[0\] was 1 in training, is 2 now"),
        (trained, None, r"latents: trained with \['mean', 'std'\], now none"),
    ):
        refused = (
            rf"checkpoint_step_2 was trained with other data statistics than the dataset D gives now \({diff}"
        )
        with pytest.raises(TargetError, match=refused):
            check_trained_stats(tmp_path, normalizer, stats, "the dataset D", said.append)
    del state["data_stats"]
    target.write_text(json.dumps(state))
    (ckpt / "COMPLETE").write_text(json.dumps({"step": 2, "files": {target.name: target.stat().st_size}}))
    check_trained_stats(tmp_path, wider, None, "the dataset D", said.append)
    old = "records no data statistics (an older checkpoint): the dataset D's are used, unchecked"
    assert said == [f"{ckpt / 'train_state.json'} {old}"]


def test_a_damaged_or_mismatched_checkpoint_is_one_target_error(tmp_path, model):
    """Found by a review: a shard that fails its sha256 in COMPLETE was evaluated (NaN scores, exit 0) and
    served; a checkpoint of another model raised DCP's CheckpointException, a BaseException that `except
    Exception` let through as a traceback."""
    import hashlib

    import torch.distributed.checkpoint as dcp

    ckpt = tmp_path / "checkpoint_step_7"
    ckpt.mkdir()
    dcp.save({"train": {"model": model.state_dict()}}, checkpoint_id=str(ckpt), no_dist=True)
    other = model.cfg.to_dict()
    other["model"]["depth"] += 1
    (ckpt / "train_state.json").write_text(json.dumps({"step": 7, "config": other}))

    def mark() -> None:
        files = {p.name: p.stat().st_size for p in ckpt.iterdir() if p.name != "COMPLETE"}
        digests = {name: hashlib.sha256((ckpt / name).read_bytes()).hexdigest() for name in files}
        (ckpt / "COMPLETE").write_text(json.dumps({"step": 7, "files": files, "sha256": digests}))

    mark()
    with pytest.raises(TargetError, match="its model state does not load into the run's model"):
        load_model(ckpt, None)
    shard = next(ckpt.glob("*.distcp"))
    data = bytearray(shard.read_bytes())
    data[100:200] = bytes(b ^ 0xFF for b in data[100:200])  # same size: only the sha256 tells
    shard.write_bytes(bytes(data))
    with pytest.raises(TargetError, match=f"damaged: {shard.name} does not match its sha256 in COMPLETE"):
        load_model(ckpt, None)


def test_each_episode_is_evaluated_with_its_own_prompt(model):
    """An Episode's prompt_emb (a LeRobot task) replaces the sampler's prompt for that episode only: the
    scores equal a sampler made with that prompt, and differ from the default prompt's."""
    import dataclasses

    norm = QuantileNormalizer(np.full(8, -1, np.float32), np.full(8, 1, np.float32))
    eps = _episodes(model, count=1)
    task = torch.randn(TEXT, model.cfg.model.text_dim, generator=torch.Generator().manual_seed(9))
    default = evaluate_open_loop(_sampler(model), eps, ACTION_SLOTS, norm, seed=3)
    own = evaluate_open_loop(
        _sampler(model), [dataclasses.replace(eps[0], prompt_emb=task)], ACTION_SLOTS, norm, 3
    )
    made_with = _sampler(model)
    made_with.text[0] = task
    assert own == evaluate_open_loop(made_with, eps, ACTION_SLOTS, norm, seed=3)
    assert own != default


def test_a_device_this_node_lacks_is_one_target_error_before_anything_loads():
    from trainer.sampling.load import pick_device

    assert pick_device("cpu").type == "cpu" and pick_device("auto").type in ("cpu", "cuda")
    with pytest.raises(TargetError, match="--device foo: not a device here"):
        pick_device("foo")
    if not torch.cuda.is_available():  # was: torch's AssertionError traceback after the whole model load
        with pytest.raises(TargetError, match="--device cuda: this node has 0 CUDA GPUs"):
            pick_device("cuda")


def test_the_default_plots_dir_is_the_checkpoints_run_or_the_repos_runs_folder(tmp_path):
    """Found by a review: a reference-layout folder's plots went to ./evaluation/<name> in the working
    directory (an untracked folder in the checkout), every export's under the one name `transformer`."""
    from provision.paths import repo_root
    from trainer.evaluation.cli import default_plots_dir

    ckpt = tmp_path / "run" / "checkpoints" / "checkpoint_step_4"
    assert default_plots_dir("checkpoint", ckpt) == tmp_path / "run" / "evaluation" / "checkpoint_step_4"
    export = tmp_path / "run" / "exports" / "checkpoint_step_4" / "transformer"
    assert default_plots_dir("reference", export) == repo_root() / "runs" / "evaluation" / "checkpoint_step_4"
    released = tmp_path / "models" / "lingbot-va-base"
    assert default_plots_dir("reference", released) == repo_root() / "runs" / "evaluation" / "lingbot-va-base"


def test_an_unusable_plots_dir_is_refused_before_the_work(tmp_path):
    """It failed with a traceback after the whole evaluation (a file, a folder under a file)."""
    import click

    from trainer.evaluation.cli import writable_dir

    writable_dir(tmp_path / "new" / "deeper", "--plots-dir")  # made later, in a folder that exists
    assert not (tmp_path / "new").exists()  # nothing made by the check
    (tmp_path / "a-file").write_text("")
    for bad, said in ((tmp_path / "a-file", "is a file"), (tmp_path / "a-file" / "sub", "is not a folder")):
        with pytest.raises(click.BadParameter, match=said):
            writable_dir(bad, "--plots-dir")


def test_a_set_the_loaded_model_cannot_follow_is_refused_and_the_others_apply(model):
    """`bin/evaluate RUN --set model.depth=8` evaluated the 2-layer checkpoint and said nothing."""
    from trainer.sampling.load import apply_sets

    cfg = apply_sets(model.cfg, ["infer.video_steps=2", "model.attention=sdpa"], "checkpoint X")
    assert cfg.infer.video_steps == 2 and cfg.model.attention == "sdpa"
    same = f"model.depth={model.cfg.model.depth}"  # the loaded value itself: nothing dropped
    assert apply_sets(model.cfg, [same], "checkpoint X").model.depth == model.cfg.model.depth
    with pytest.raises(TargetError, match=r"--set model.depth=8: the model is checkpoint X's own"):
        apply_sets(model.cfg, ["model.depth=8"], "checkpoint X")
    # of data.*, a checkpoint takes only where its data are (a review: swapped cameras, a held-out split
    # holding training episodes and other statistics were all accepted unsaid); a released folder takes any
    val = f"data.val_episodes={model.cfg.data.val_episodes + 1:g}"
    with pytest.raises(
        TargetError, match=r"--set data.val_episodes=.*: checkpoint X was trained with data.val_"
    ):
        apply_sets(model.cfg, [val], "checkpoint X", checkpoint=True)
    moved = apply_sets(
        model.cfg, ["data.path=/elsewhere", "data.cache_dir=/big"], "checkpoint X", checkpoint=True
    )
    assert (moved.data.path, moved.data.cache_dir) == ("/elsewhere", "/big")
    assert apply_sets(model.cfg, [val], "folder Y").data.val_episodes == model.cfg.data.val_episodes + 1
