"""LeRobot datasets in (trainer/data/formats/: lerobot.py, lerobot_v3.py, upstream.py, video.py;
trainer/data/cache/lerobot_entries.py):
meta parsing and bad input on hand-written meta/ (fast), and datasets written by lerobot itself
(tests/support/lerobot_env.py: cached test-only environments; 0.3.3 writes v2.1, 0.4.4 writes v3.0)
decoded, prepared with the tiny AutoencoderKLWan/UMT5, written to and read from the reference's latents/
layout, trained 2 steps (heavy; the decode and cache tests run on both layouts, bin/train on v3.0).

Where v2.1's end-to-end claims are held: a v2.1 dataset under bin/train, tests/test_presets.py::
test_bin_train_runs_the_preset_on_its_layout (both presets' datasets are lerobot 0.3.3's v2.1, asserted);
v2.1 held-out names and bin/evaluate's per-episode prompts, test_several_roots_make_one_stream; wan_vae
latents of a v2.1 dataset, test_prepare_writes_and_reads_the_reference_latents_layout."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.support import runs
from tests.support.lerobot_env import lerobot_site, run_writer
from trainer.config import RunConfig, apply_overrides
from trainer.config.rules import violations
from trainer.data.formats import lerobot
from trainer.data.formats.furniturebench import DatasetError

FRONT, WRIST, STILL = "observation.images.front", "observation.images.wrist", "observation.images.still"


def _meta(root: Path, version="v2.1", codec="av1", stats=True) -> Path:
    (root / "meta").mkdir(parents=True)
    video = {"dtype": "video", "shape": [8, 8, 3], "info": {"video.codec": codec}}
    info = {
        "codebase_version": version, "fps": 10, "chunks_size": 1000,
        "data_path": "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet",
        "video_path": "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4",
        "features": {FRONT: video, "action": {"dtype": "float32", "shape": [3]},
                     "observation.state": {"dtype": "float32", "shape": [2]}},
    }  # fmt: skip
    (root / "meta/info.json").write_text(json.dumps(info))
    eps = [{"episode_index": i, "tasks": [f"task {i % 2}"], "length": 5} for i in range(2)]
    (root / "meta/episodes.jsonl").write_text("".join(json.dumps(e) + "\n" for e in eps))
    (root / "meta/tasks.jsonl").write_text(
        '{"task_index": 0, "task": "task 0"}\n{"task_index": 1, "task": "task 1"}\n'
    )
    if stats:
        rows = [
            {"episode_index": 0, "stats": {"action": {"mean": [0, 1, 2], "std": [1, 1, 1], "min": [-1] * 3,
                                                       "max": [3] * 3, "count": [10]}}},
            {"episode_index": 1, "stats": {"action": {"mean": [2, 1, 2], "std": [1, 2, 0], "min": [-2] * 3,
                                                       "max": [4] * 3, "count": [30]}}},
        ]  # fmt: skip
        (root / "meta/episodes_stats.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


@pytest.mark.fast
def test_meta_parsing_action_map_and_pooled_stats(tmp_path):
    ds = lerobot.load(_meta(tmp_path / "ds"))
    assert ds.tasks == ["task 0", "task 1"] and [p.name for p in ds.files()] == [
        "episode_000000.parquet", "episode_000001.parquet"]  # fmt: skip
    assert lerobot.parse_action_map(ds, ["action[1:3]", "observation.state[0]"]) == [
        ("action", 1), ("action", 2), ("observation.state", 0)]  # fmt: skip
    stats = lerobot.mapped_stats(ds, lerobot.parse_action_map(ds, ["action"]))
    assert np.allclose(stats["mean"], [1.5, 1.0, 2.0])  # weighted by count 10 : 30
    # pooled: E[x^2] - mean^2 over both episodes (channel 0: 0.25 (1 + 0) + 0.75 (1 + 4) - 1.5^2 = 1.75)
    assert np.allclose(stats["std"], np.sqrt([1.75, 0.25 * 1 + 0.75 * 4 + 1 - 1, 0.25 * 5 + 0.75 * 4 - 4]))
    assert stats["min"] == [-2.0] * 3 and stats["max"] == [4.0] * 3


@pytest.mark.fast
@pytest.mark.parametrize(
    "entries, problem",
    [(["nope"], "'nope' (data.action_map) is not a numeric feature"), (["action[5]"], "action has 3 values"),
     ([FRONT], "is not a numeric feature"), (["action[1"], "write `key`, `key[i]` or `key[i:j]`")],
)  # fmt: skip
def test_bad_action_map_is_named(tmp_path, entries, problem):
    ds = lerobot.load(_meta(tmp_path / "ds"))
    with pytest.raises(DatasetError) as exc:
        lerobot.parse_action_map(ds, entries)
    assert problem in str(exc.value)


@pytest.mark.fast
def test_camera_not_in_info_json_and_codec_without_decoder_are_named(tmp_path):
    ds = lerobot.load(_meta(tmp_path / "a"))
    with pytest.raises(DatasetError) as exc:
        lerobot.check_cameras(ds, ["observation.images.top"])
    assert "meta/info.json" in str(exc.value) and f"set data.cameras to some of {FRONT}" in str(exc.value)
    ds = lerobot.load(_meta(tmp_path / "b", codec="nocodec9"))
    with pytest.raises(DatasetError) as exc:
        lerobot.check_cameras(ds, [FRONT])
    assert "codec 'nocodec9'" in str(exc.value) and "re-encode the videos" in str(exc.value)


@pytest.mark.fast
def test_unknown_versions_v3_without_episodes_and_missing_stats_refused_with_the_fix(tmp_path):
    with pytest.raises(DatasetError, match=r"'v4.0': only LeRobot v2.0/v2.1 and v3.0 datasets are read"):
        lerobot.load(_meta(tmp_path / "v4", version="v4.0"))
    with pytest.raises(DatasetError, match=r"meta/episodes: no chunk-\*/file-\*.parquet"):
        lerobot.load(_meta(tmp_path / "v3", version="v3.0"))  # v3.0 with v2.1's jsonl meta
    ds = lerobot.load(_meta(tmp_path / "nostats", stats=False))
    with pytest.raises(DatasetError, match="data.normalize=fit"):
        lerobot.mapped_stats(ds, [("action", 0)])


def _meta_v3(root: Path, to_timestamp: float = 1.0) -> Path:
    """A v3.0 meta/ as lerobot 0.4.4 lays it out (2 episodes of 5 and 10 frames in one data and one video
    file; the tasks as the pandas index of tasks.parquet), without data or video files."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    (root / "meta/episodes/chunk-000").mkdir(parents=True)
    video = {"dtype": "video", "shape": [8, 8, 3], "info": {"video.codec": "av1"}}
    info = {
        "codebase_version": "v3.0", "fps": 10, "chunks_size": 1000,
        "data_path": "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet",
        "video_path": "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4",
        "features": {FRONT: video, "action": {"dtype": "float32", "shape": [3]}},
    }  # fmt: skip
    (root / "meta/info.json").write_text(json.dumps(info))
    v = f"videos/{FRONT}/"
    rows = {
        "episode_index": [1, 0], "tasks": [["task b"], ["task a"]], "length": [10, 5],
        "data/chunk_index": [0, 0], "data/file_index": [0, 0],
        v + "chunk_index": [0, 0], v + "file_index": [0, 0],
        v + "from_timestamp": [0.5, 0.0], v + "to_timestamp": [to_timestamp + 0.5, 0.5],
        "stats/action/mean": [[0.0] * 3, [1.0] * 3],
    }  # fmt: skip
    pq.write_table(pa.table(rows), root / "meta/episodes/chunk-000/file-000.parquet")
    tasks = pa.table({"task_index": [1, 0], "__index_level_0__": ["task b", "task a"]})
    pq.write_table(tasks, root / "meta/tasks.parquet")
    stats = {"action": {"mean": [1, 2, 3], "std": [1, 1, 1], "q01": [0] * 3, "q99": [4] * 3, "count": [15]}}
    (root / "meta/stats.json").write_text(json.dumps(stats))
    return root


@pytest.mark.fast
def test_v3_meta_sources_and_timestamp_mismatch(tmp_path):
    from trainer.data.cache.store import source_file
    from trainer.data.formats import lerobot_v3

    ds = lerobot.load(_meta_v3(tmp_path / "ds"))
    data = tmp_path / "ds/data/chunk-000/file-000.parquet"
    assert ds.version == "v3.0" and ds.tasks == ["task a", "task b"] and ds.layout.startswith("LeRobot v3.0")
    assert ds.files() == [data / "episode_000000", data / "episode_000001"]
    assert [source_file(f) for f in ds.files()] == [data, data] == [ds.backing(f) for f in ds.files()]
    assert ds.video(1, FRONT) == tmp_path / f"ds/videos/{FRONT}/chunk-000/file-000.mp4"
    assert [ds.task_of(ds.episode_of(f)) for f in ds.files()] == ["task a", "task b"]
    stats = lerobot.mapped_stats(ds, lerobot.parse_action_map(ds, ["action"]))
    assert stats["q99"] == [4.0] * 3 and "count" not in stats  # meta/stats.json, quantiles included
    assert lerobot_v3.segment(ds, ds.episodes[1], FRONT) == (0.5, 1.5)
    with pytest.raises(DatasetError, match=f"episode 1 has no videos/{WRIST}/chunk_index"):
        ds.video(1, WRIST)
    with pytest.raises(
        DatasetError, match=r"data/chunk-000/file-000.parquet: data file of episode 0 .* missing"
    ):
        lerobot.read_episode(ds, ds.files()[0], [FRONT], [])
    bad = lerobot.load(_meta_v3(tmp_path / "bad", to_timestamp=1.2))  # 12 frames' span, 10 rows
    with pytest.raises(DatasetError, match=r"from_timestamp 0.5 to to_timestamp 1.7 spans 12.00 frames"):
        lerobot_v3.segment(bad, bad.episodes[1], FRONT)


@pytest.mark.fast
def test_config_rules_for_lerobot_keys():
    def problems(**values):
        cfg = RunConfig()
        apply_overrides(cfg, values, "test")
        return violations(cfg, {})

    assert problems(**{"data.cameras": f"{FRONT},{WRIST}"}) == []  # auto: dotted LeRobot keys
    assert problems(**{"data.format": "lerobot", "data.cameras": "top"}) == []
    assert problems(**{"data.format": "furniturebench", "data.cameras": FRONT})
    assert problems(**{"data.action_slots": "0,0,1,2,3,4,5,6"})  # not distinct
    assert problems(**{"data.normalize": "minmax"}) and problems(**{"data.upstream_latents": "yes"})


# ---- datasets lerobot 0.3.3 (v2.1) and 0.4.4 (v3.0) wrote (heavy: package environments built on first use)

V21, V30 = "0.3.3", "0.4.4"  # lerobot releases -> the layout they write
LAYOUTS = {V21: "v2.1", V30: "v3.0"}


@pytest.fixture(scope="module")
def writer(tmp_path_factory):
    """version -> (dataset root, the frames written): 3 episodes of 13-15 frames, 32 px, lerobot's default
    codec, written once per module and version."""
    made: dict[str, tuple[Path, dict[str, np.ndarray]]] = {}

    def get(version: str) -> tuple[Path, dict[str, np.ndarray]]:
        if version not in made:
            root = tmp_path_factory.mktemp(f"lerobot-{version}") / "ds"
            site = lerobot_site(version=version)
            run_writer(Path(__file__).parent / "support" / "lerobot_write.py", [str(root)], site)
            with np.load(root.parent / "ds.frames.npz") as z:
                made[version] = root, {k: z[k] for k in z.files}
        return made[version]

    return get


@pytest.fixture
def written(writer):
    return writer(V21)


def _psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(((a.astype(np.float64) - b.astype(np.float64)) ** 2).mean())
    return float("inf") if mse == 0 else 10 * np.log10(255.0**2 / mse)


@pytest.mark.heavy
@pytest.mark.parametrize("version", [V21, V30])
def test_frames_decode_as_written(writer, version, monkeypatch):
    import pyarrow.parquet as pq

    given: list[object] = []  # pyarrow is only ever handed paths (see the recorder below)
    for name in ("read_table", "read_schema"):
        real = getattr(pq, name)
        monkeypatch.setattr(
            pq, name, lambda src, *a, _real=real, **k: given.append(src) or _real(src, *a, **k)
        )
    root, frames = writer(version)
    ds = lerobot.load(root)
    assert ds.version == LAYOUTS[version] and ds.features[FRONT]["info"]["video.codec"] == "av1"
    if version == V30:  # every episode in one data file and one video file per camera
        assert {ds.backing(f) for f in ds.files()} == {root / "data/chunk-000/file-000.parquet"}
        assert {ds.video(e, WRIST) for e in range(3)} == {root / f"videos/{WRIST}/chunk-000/file-000.mp4"}
    for e, parquet in enumerate(ds.files()):
        ep = lerobot.read_episode(
            ds, parquet, [FRONT, WRIST, STILL], lerobot.parse_action_map(ds, ["action"])
        )
        assert np.array_equal(ep.images[STILL], frames[f"{STILL}__{e}"])  # PNG in the parquet: lossless
        # AV1 (libsvtav1, crf 30, yuv420p): measured ~31 dB at 32 px (v2.1), 29.8-30.2 dB (v3.0)
        for cam in (FRONT, WRIST):
            assert ep.images[cam].shape == frames[f"{cam}__{e}"].shape
            assert _psnr(ep.images[cam], frames[f"{cam}__{e}"]) > 28.0
            _in_order(ep.images[cam], frames[f"{cam}__{e}"])
        assert (
            ep.actions.shape == (13 + e, 7)
            and ep.task == ("put the red cube in the bowl", "open the drawer")[e % 2]
        )
    # A Python file object read on pyarrow 21's thread pool aborts the process at exit about half the
    # time (tests/test_worker_simulation.py::test_lerobot_decoders_load_and_run_without_a_toolchain).
    assert given and all(isinstance(src, (str, Path)) for src in given), given


@pytest.mark.heavy
def test_bad_lerobot_input_is_named(written, tmp_path):
    root = tmp_path / "ds"
    shutil.copytree(written[0], root)
    ds = lerobot.load(root)
    files = ds.files()
    channels = lerobot.parse_action_map(ds, ["action"])
    v0, v1 = ds.video(0, FRONT), ds.video(1, FRONT)
    shutil.copy2(v1, v0)  # 14 frames for a 13-row episode
    with pytest.raises(DatasetError, match=r"14 frames but episode_000000.parquet has 13 rows"):
        lerobot.read_episode(ds, files[0], [FRONT], channels)
    v1.unlink()
    with pytest.raises(DatasetError, match=rf"{v1}: video of episode 1, camera {FRONT} missing"):
        lerobot.read_episode(ds, files[1], [FRONT], channels)
    import pyarrow.parquet as pq

    pq.write_table(pq.read_table(files[2]).drop(["action"]), files[2])
    with pytest.raises(DatasetError, match=r"episode_000002.parquet: column 'action' missing"):
        lerobot.read_episode(ds, files[2], [], channels)


def _set_episode(root: Path, index: int, **values) -> None:
    """Rewrite columns of episode `index`'s row in meta/episodes/chunk-000/file-000.parquet (v3.0)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = root / "meta/episodes/chunk-000/file-000.parquet"
    table = pq.read_table(path)
    rows = table.column("episode_index").to_pylist().index(index)
    for key, value in values.items():
        column = table.column(key).to_pylist()
        column[rows] = value
        table = table.set_column(
            table.column_names.index(key), key, pa.array(column, table.schema.field(key).type)
        )
    pq.write_table(table, path)


@pytest.mark.heavy
def test_bad_v3_input_is_named(writer, tmp_path):
    """lerobot 0.4.4's v3.0 layout: a length mismatch is between an episode's from/to timestamps (or the
    frames they cover) and its rows; missing video file, missing column, camera not in info.json."""
    import pyarrow.parquet as pq

    root = tmp_path / "ds"
    shutil.copytree(writer(V30)[0], root)
    channels = lerobot.parse_action_map(lerobot.load(root), ["action"])
    ts = f"videos/{FRONT}/to_timestamp"
    _set_episode(root, 1, **{ts: 3.0})  # 1.3 .. 3.0 s at 10 fps is 17 frames, the episode has 14
    ds = lerobot.load(root)
    with pytest.raises(DatasetError, match=r"meta/episodes: episode 1, camera .*front: from_timestamp 1.3 to "
                       r"to_timestamp 3.0 spans 17.00 frames at 10 fps but the episode has 14"):  # fmt: skip
        lerobot.read_episode(ds, ds.files()[1], [FRONT], channels)
    _set_episode(root, 2, **{f"videos/{FRONT}/from_timestamp": 2.8, ts: 4.3})  # past the file's end
    ds = lerobot.load(root)
    video = ds.video(2, FRONT)
    with pytest.raises(DatasetError, match=rf"{video}: 14 frames between 2.8 s and 4.3 s \(episode 2, camera "
                       rf"{FRONT}\) but the episode has 15 rows"):  # fmt: skip
        lerobot.read_episode(ds, ds.files()[2], [FRONT], channels)
    lerobot.read_episode(ds, ds.files()[0], [FRONT], channels)  # episode 0 untouched: still reads
    with pytest.raises(DatasetError, match="camera 'observation.images.top' is not a video or image feature"):
        lerobot.check_cameras(ds, ["observation.images.top"])
    wrist = ds.video(0, WRIST)
    wrist.unlink()
    with pytest.raises(DatasetError, match=rf"{wrist}: video of episode 0, camera {WRIST} missing"):
        lerobot.read_episode(ds, ds.files()[0], [WRIST], channels)
    data = ds.backing(ds.files()[0])
    pq.write_table(pq.read_table(data).drop(["action"]), data)
    with pytest.raises(DatasetError, match=r"file-000.parquet: column 'action' missing"):
        lerobot.read_episode(ds, ds.files()[0], [], channels)


@pytest.mark.heavy
def test_h264_videos_decode_too(tmp_path):
    root = tmp_path / "h264"
    args = [str(root), "--episodes", "1", "--length", "9", "--vcodec", "h264"]
    run_writer(Path(__file__).parent / "support" / "lerobot_write.py", args, lerobot_site())
    ds = lerobot.load(root)
    assert ds.features[FRONT]["info"]["video.codec"] == "h264"
    ep = lerobot.read_episode(ds, ds.files()[0], [FRONT], [])
    with np.load(root.parent / "h264.frames.npz") as z:
        want = z[f"{FRONT}__0"]
    assert _psnr(ep.images[FRONT], want) > 25.0  # libx264 crf 30, yuv420p, 32 px: measured 27.3 dB
    _in_order(ep.images[FRONT], want)


def _in_order(got: np.ndarray, want: np.ndarray) -> None:
    """Each decoded frame is closest to the frame written at its own index (no shift, drop or repeat)."""
    for i in range(len(want)):
        scores = [_psnr(got[i], want[j]) for j in range(len(want))]
        assert int(np.argmax(scores)) == i, (i, scores)


@pytest.mark.heavy
@pytest.mark.parametrize("version", [V21, V30])
def test_cache_resumes_and_a_changed_video_makes_it_stale(writer, version, tmp_path):
    import re

    from trainer.config import load_config, parse_set
    from trainer.data.cache.manifest import StaleCache
    from trainer.data.cache.prepare import ensure_cache, prepare

    root = tmp_path / "ds"
    shutil.copytree(writer(version)[0], root)
    items = [f"data.path={root}", f"data.cameras={FRONT},{WRIST}", "model.action_used=7", "data.frames=3",
             "model.latent_size=2", "data.val_episodes=1"]  # fmt: skip
    cfg = load_config("furniture_train", True, parse_set(items))
    first = prepare(cfg, log=lambda line: None)
    assert (first.encoded, first.kept) == (3, 0)
    again = prepare(cfg, log=lambda line: None)
    assert (again.encoded, again.kept) == (0, 3)  # resumable: finished entries are kept
    ensure_cache(cfg, 0, 1, log=lambda line: None)  # complete and current
    video = lerobot.load(root).video(1, WRIST)  # v3.0: the file every episode's wrist video is in
    video.write_bytes(video.read_bytes() + b"\0")
    with pytest.raises(StaleCache, match=re.escape(f"{video.relative_to(root).as_posix()}: size")):
        ensure_cache(cfg, 0, 1, log=lambda line: None)


def _cfg_items(root: Path, vae_root: Path, *extra: str) -> list[str]:
    return [
        f"data.path={root}", f"data.cameras={FRONT},{WRIST}", "model.action_used=7", "data.encoder=wan_vae",
        f"data.vae_path={vae_root / 'vae'}", f"data.text_encoder={vae_root}", "data.actions_per_frame=4",
        "data.frames=3", "data.text_length=16", "model.text_dim=16", "model.latent_channels=4",
        "model.latent_size=2", "data.val_episodes=1", *extra,
    ]  # fmt: skip


@pytest.fixture(scope="module")
def released(tmp_path_factory):
    from tests.test_data import make_tiny_t5, make_tiny_vae

    root = tmp_path_factory.mktemp("lingbot-va-base")
    make_tiny_vae(root / "vae")
    make_tiny_t5(root)
    return root


@pytest.mark.heavy
def test_prepare_writes_and_reads_the_reference_latents_layout(written, released, tmp_path, monkeypatch):
    import torch

    from trainer.config import load_config, parse_set
    from trainer.data.cache.prepare import prepare
    from trainer.data.encoding import encoder
    from trainer.data.stream import build_stream

    root = tmp_path / "ds"
    shutil.copytree(written[0], root)
    items = _cfg_items(root, released, "data.upstream_latents=write", "data.normalize=mean_std")
    done = prepare(load_config("furniture_train", True, parse_set(items)), log=lambda line: None)
    manifest = json.loads((done.directory / "manifest.json").read_text())
    assert manifest["lerobot"]["tasks"] == ["put the red cube in the bowl", "open the drawer"]
    assert manifest["spec"]["encoder"] == "wan_vae" and manifest["stand_ins"] == []
    record = torch.load(root / f"latents/chunk-000/{FRONT}/episode_000000_0_13.pth", weights_only=True)
    assert (record["latent_num_frames"], record["latent_height"], record["latent_width"]) == (4, 2, 2)
    assert record["latent"].shape == (16, 4) and record["text_emb"].shape == (16, 16)
    assert record["frame_ids"] == list(range(13)) and record["fps"] == 10
    with np.load(done.directory / "episodes" / manifest["episodes"][0]["entry"]) as z:
        cached = z[f"latents__{FRONT}"].astype(np.float32)
    assert np.allclose(
        cached.transpose(0, 2, 3, 1).reshape(16, 4), record["latent"].float().numpy(), atol=2e-2
    )
    cfg = load_config("furniture_train", True, parse_set(items))
    stream = build_stream(cfg, 0, 1)
    a, b = stream.clip_batch(0, 0)["text_emb"], stream.clip_batch(1, 0)["text_emb"]
    assert not torch.equal(a, b)  # episode 0 and 1 have different tasks: different prompts

    def no_encoding(*args, **kwargs):
        raise AssertionError("read mode must not encode")

    monkeypatch.setattr(encoder.WanVAEEncoder, "encode", no_encoding)
    read = prepare(
        load_config(
            "furniture_train", True, parse_set(_cfg_items(root, released, "data.upstream_latents=read"))
        ),
        log=lambda line: None,
    )
    with np.load(read.directory / "episodes" / manifest["episodes"][0]["entry"]) as z:
        assert np.allclose(z[f"latents__{FRONT}"].astype(np.float32), cached, atol=2e-2)


@pytest.mark.heavy
@pytest.mark.parametrize("version", [V30])  # v2.1: see the module docstring
def test_bin_train_two_steps_on_a_lerobot_dataset(
    writer, version, released, tmp_path, preflight_record, monkeypatch
):
    import torch

    root = tmp_path / "ds"
    shutil.copytree(writer(version)[0], root)
    run = tmp_path / "run"
    runs.seed_preflight(run, preflight_record)
    overrides = [*runs.tiny(steps=2, grad_accum=1), *_cfg_items(root, released)]
    proc = runs.launch(run, root, runs.clean_env(tmp_path / "no-envs"), overrides=overrides, nproc=1)
    code, out, _ = runs.finish(proc)
    assert code == 0, out
    summary = runs.summary(run)
    assert (
        summary["data"]["layout"].startswith(f"LeRobot {LAYOUTS[version]}") and summary["data"]["used"] == 3
    )
    held = "data/chunk-000/" + (
        "file-000.parquet/episode_000002" if version == V30 else "episode_000002.parquet"
    )
    assert summary["data"]["split"]["held_out"] == [held]
    assert sorted(runs.losses_by_step(run)) == [1, 2]
    # bin/evaluate on it: every episode with its own task's prompt (episodes 0 and 2 share a task)
    from trainer.evaluation.cli import run as evaluate
    from trainer.sampling.load import load_model
    from trainer.sampling.rundata import load_episodes

    data = load_episodes(load_model(str(run), None)[1])
    assert data.prompts is not None and data.names[2] == held
    assert torch.equal(data.prompts[0], data.prompts[2]) and not torch.equal(data.prompts[0], data.prompts[1])
    result = evaluate(str(run), "all", "furniture_train", True, (), 0, "cpu")
    assert result["episodes"] == 3 and sorted(result["per_episode"]) == sorted(data.names)
    # the checkpoint records the statistics it was trained with; others are never used to score it (a
    # review: `--set data.normalize=mean_std`, or an episode added since, rescaled every action unsaid)
    from trainer.sampling.load import TargetError

    last = run / "checkpoints" / f"checkpoint_step_{runs.complete_steps(run)[-1]}"
    stats = json.loads((last / "train_state.json").read_text())["data_stats"]
    assert sorted(stats["actions"]) == ["q01", "q99"] and len(stats["actions"]["q01"]) >= 2
    # (the evaluation above passed its check against them: what it derives is what training recorded)
    with pytest.raises(
        TargetError, match=r"--set data.normalize='mean_std': .* was trained with data.normal"
    ):
        evaluate(str(run), "all", "furniture_train", True, ("data.normalize=mean_std",), 0, "cpu")
    # nothing predicted (no episode as long as a chunk) is no score: no MAE line, no plot over an earlier one
    plots = tmp_path / "plots-nothing"
    failed = evaluate(
        str(run), "all", "furniture_train", True, ("infer.frames_per_chunk=99",), 0, "cpu", plots
    )
    assert failed["overall"] is None and failed["error"].startswith("no action was predicted")
    assert not list(plots.glob("*.png"))
    # a guidance that overflows float32: non-finite scores are a failure (exit 1, named), never exit 0
    from trainer.evaluation.cli import main as evaluate_main

    argv = [
        str(run),
        "--plots-dir",
        str(tmp_path / "plots"),
        "--json-file",
        str(tmp_path / "o"),
    ]
    argv += ["--set", "infer.guidance=3e38", "--set", "infer.action_guidance=3e38"]
    monkeypatch.setattr("sys.argv", ["bin/evaluate", *argv])  # where its --json-file is read
    with pytest.raises(SystemExit) as ended:
        evaluate_main.main(argv, standalone_mode=False)
    assert ended.value.code == 1
    said = json.loads((tmp_path / "o").read_text())
    assert said["ok"] is False and "non-finite scores" in said["error"], said


@pytest.mark.fast
@pytest.mark.parametrize(
    "sets, problem",
    [(["data.cameras=observation.images.top"], "camera 'observation.images.top' is not a video or image"),
     ([f"data.cameras={FRONT}"], "episode_000000.parquet: episode 0's parquet missing"),
     ([f"data.cameras={FRONT}", "data.action_map=effort"], "'effort' (data.action_map) is not a numeric")],
)  # fmt: skip
def test_the_launcher_preflight_names_bad_lerobot_input_with_exit_3(tmp_path, capsys, sets, problem):
    from trainer.launcher import main as launch

    root = _meta(tmp_path / "ds")
    argv = ["furniture_train", "1", "--run-dir", str(tmp_path / "run"), "--set", f"data.path={root}"]
    assert launch.main([*argv, *(a for s in sets for a in ("--set", s))]) == 3
    err = capsys.readouterr().err
    assert problem in err and "preflight failed" in err, err
    assert not (tmp_path / "run" / "checkpoints").exists()


@pytest.mark.fast
def test_several_roots_only_for_lerobot():
    cfg = RunConfig()
    apply_overrides(cfg, {"data.path": "/a,/b"}, "test")
    assert any("data.path" in p for p in violations(cfg, {}))
    apply_overrides(cfg, {"data.format": "lerobot"}, "test")
    assert violations(cfg, {}) == []


@pytest.mark.heavy
def test_several_roots_make_one_stream(written, tmp_path):
    import torch

    from trainer.config import load_config, parse_set
    from trainer.data.stream import build_stream

    a, b = tmp_path / "a" / "ds", tmp_path / "b" / "ds"
    shutil.copytree(written[0], a)
    shutil.copytree(written[0], b)
    items = [f"data.path={a},{b}", "data.format=lerobot", f"data.cameras={FRONT}", "model.action_used=7",
             "data.frames=3", "model.latent_size=2", "data.val_episodes=2"]  # fmt: skip
    stream = build_stream(load_config("furniture_train", True, parse_set(items)), 0, 1)
    assert stream.names[:3] == [f"0:ds/data/chunk-000/episode_00000{i}.parquet" for i in range(3)]
    assert stream.names[3:] == [f"1:ds/data/chunk-000/episode_00000{i}.parquet" for i in range(3)]
    assert len(stream.held_out) == 2 and stream.data_summary is not None and stream.data_summary.used == 6
    assert stream.task_emb is not None and stream.task_emb.shape[0] == 4  # 2 tasks per root, appended
    assert stream.episode_task == [0, 1, 0, 2, 3, 2]
    assert (a / ".latents").is_dir() and (b / ".latents").is_dir()  # one cache per root
    from trainer.sampling.rundata import load_episodes

    data = load_episodes(load_config("furniture_train", True, parse_set(items)))  # bin/evaluate's episodes
    assert data.names == stream.names and data.prompts is not None and len(data.prompts) == 6
    # the roots are copies: root b's task 0 is root a's task 0's text, so the same prompt
    assert [int(torch.equal(data.prompts[0], p)) for p in data.prompts] == [1, 0, 1, 1, 0, 1]


@pytest.mark.heavy
def test_short_episodes_are_named_with_what_one_clip_needs(released, tmp_path, preflight_record):
    """lerobot 0.4.4's own writer, six episodes of 8-13 frames; a clip of 4 latent frames at the VAE's
    temporal stride 4 needs 13: one usable episode, which the held-out split takes (the user's case)."""
    root = tmp_path / "ds"
    args = [str(root), "--episodes", "6", "--length", "8"]
    run_writer(Path(__file__).parent / "support" / "lerobot_write.py", args, lerobot_site(version=V30))
    run = tmp_path / "run"
    runs.seed_preflight(run, preflight_record)
    overrides = [*runs.tiny(steps=2, grad_accum=1), *_cfg_items(root, released, "data.frames=4")]
    proc = runs.launch(run, root, runs.clean_env(tmp_path / "no-envs"), overrides=overrides, nproc=1)
    code, out, _ = runs.finish(proc)
    assert code == 1, out
    named = ", ".join(f"episode_00000{e} ({8 + e} frames)" for e in range(5))
    line = (
        f"6 found, 1 used, 5 skipped (5 shorter than one clip); 5 episode(s) shorter than one clip, skipped: "
        f"{named}; one clip needs 13 frames (data.frames=4 latent frames, the encoder's temporal stride 4: "
        "1 + 4 x 3); lower data.frames"
    )
    assert line in out, out
    assert "has only 1 usable episode(s), leaving none to train on" in out, out
    assert "5 more episode(s) were found but are shorter than one clip (13 frames" in out, out
    short = runs.summary(run)
    assert "5 more episode(s) were found but are shorter than one clip" in str(short.get("rank_error")), short
