"""bin/serve end to end (issue 32's "done when"): a checkpoint trained by bin/train in this module, served
by bin/serve (the bash entry point), driven by a client that speaks the protocol as upstream's clients do
(trainer/evaluation/replay.py PolicyClient): two connections through reset -> observation ->
compute_kv_cache -> observation, actions equal ChunkSampler's; bad requests answered with an error while
the other connection keeps working; the API key, the frame and connection limits; the replay's action
error equal to bin/evaluate's (and its PNG); SIGTERM -> exit 0, nothing left running.

The run: tiny (tests/support/runs.py) with data.actions_per_frame=4, the stand-in's temporal factor 4: a
client sends the key frames at upstream's cadence (four per latent frame, one every N // 4 = 1 action, as
LIBERO's client at N = 4), which the server streams into the run's training latents; chunks of 2 frames,
2 video and 2 action steps, for speed. Upstream's own client loops against LIBERO and RoboTwin geometry:
tests/test_serve_clients.py.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import torch
from websockets.exceptions import ConnectionClosedError, InvalidStatus

from tests.support.runs import REPO, TIMEOUT, clean_env, said, seed_preflight, set_args, tiny
from trainer.evaluation.replay import replay_episodes, replay_open_loop
from trainer.serving.client import PolicyClient, ServerError

pytestmark = pytest.mark.heavy
F, STEPS, N = 2, 1, 4  # N: actions per latent frame = the stand-in's temporal factor (4 key frames each)
INFER = [f"infer.frames_per_chunk={F}", f"infer.video_steps={STEPS}", f"infer.action_steps={STEPS}"]
KEY = "k3y-for-the-test"
LIMIT = 4 * 2**20  # --max-frame-bytes: a chunk's key frames (4 x 2 frames x 2 views x 224 x 224 x 3) fit


@dataclass
class Trained:
    run_dir: Path
    data: Path
    env: dict[str, str]
    root: Path

    @property
    def best(self) -> Path:
        return (self.run_dir / "checkpoints" / "best").resolve()

    @property
    def sets(self) -> list[str]:
        return [f"data.path={self.data}", *INFER]


@dataclass
class Served:
    proc: subprocess.Popen
    port: int
    lines: list[str] = field(default_factory=list)

    @property
    def uri(self) -> str:
        return f"ws://127.0.0.1:{self.port}"


@pytest.fixture(scope="module")
def trained(tmp_path_factory, preflight_record) -> Trained:
    root = tmp_path_factory.mktemp("serve")
    run_dir, data = root / "run", root / "episodes"
    seed_preflight(run_dir, preflight_record)
    env = clean_env(root / "no-envs")
    sets = set_args([*tiny(steps=2, grad_accum=1), f"data.actions_per_frame={N}", f"data.path={data}"])
    out = subprocess.run(
        [str(REPO / "bin" / "train"), "furniture_train", "1", "--run-dir", str(run_dir), *sets],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=TIMEOUT,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return Trained(run_dir, data, env, root)


def _pump(stream, lines: list[str]) -> None:
    for line in stream:
        lines.append(line.rstrip("\n"))


@pytest.fixture(scope="module")
def server(trained):
    key_file = trained.root / "api-key"
    key_file.write_text(KEY + "\n")
    argv = [str(REPO / "bin" / "serve"), str(trained.run_dir), "--port", "0", "--api-key-file", str(key_file),
            "--max-connections", "3", "--max-frame-bytes", str(LIMIT), *set_args(trained.sets)]  # fmt: skip
    proc = subprocess.Popen(
        argv, cwd=REPO, env=trained.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    lines: list[str] = []
    for stream in (proc.stdout, proc.stderr):
        threading.Thread(target=_pump, args=(stream, lines), daemon=True).start()
    deadline = time.monotonic() + TIMEOUT
    port = None
    while port is None and time.monotonic() < deadline and proc.poll() is None:
        found = [m for line in list(lines) if (m := re.search(r"listening on ws://127\.0\.0\.1:(\d+)", line))]
        port = int(found[0].group(1)) if found else None
        time.sleep(0.05)  # polling for the ready line, with a deadline
    assert port is not None, f"bin/serve exited {proc.poll()} or never listened:\n" + "\n".join(lines)
    yield Served(proc, port, lines)
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _eval_data(trained):
    from trainer.config import apply_overrides, parse_set
    from trainer.sampling.load import checkpoint_config
    from trainer.sampling.rundata import load_episodes

    cfg = checkpoint_config(trained.best)
    apply_overrides(cfg, parse_set(trained.sets), "--set")
    return cfg, load_episodes(cfg)


def _expected(model, cfg, data, index: int, prompt: str, episode: int, chunks: int) -> list[np.ndarray]:
    """ChunkSampler's actions for episode `index` of the data, as the e-th episode of a session."""
    from trainer.data.encoding.text import make_text_encoder
    from trainer.sampling.sampler import ChunkSampler, seeded, to_robot_units
    from trainer.serving.protocol import action_layout

    emb, _ = make_text_encoder(cfg).embed(prompt)
    grid = tuple(data.latents[index].shape[1:])
    sampler = ChunkSampler(model, cfg.infer, data.action_mask, torch.as_tensor(emb), data.empty_emb, grid)
    lat, act, n = data.latents[index], data.actions[index], model.apf
    out = []
    with torch.no_grad():
        for k in range(chunks):
            chunk = sampler.sample(lat[0] if k == 0 else None, generator=seeded(0, episode, k))
            out.append(action_layout(to_robot_units(chunk.actions, data.normalizer, data.slots), F, n))
            sampler.observe(lat[k * F : (k + 1) * F], act[k * F * n : (k + 1) * F * n])
    return out


def _kv(ep, k: int, n: int) -> dict:
    from trainer.serving.protocol import action_layout

    start = 1 if k == 0 else 0
    state = action_layout(ep.actions[k * F * n : (k + 1) * F * n], F, n)
    return {
        "obs": ep.key_frames(k * F + start, (k + 1) * F),
        "compute_kv_cache": True,
        "imagine": False,
        "state": state,
    }


def test_two_connections_serve_chunksampler_actions(trained, server):
    from trainer.sampling.load import load_model

    cfg, data = _eval_data(trained)
    eps = replay_episodes(cfg, data.names[:2])
    model, _, _ = load_model(trained.best, None)
    n = model.apf
    prompts = [cfg.data.prompt, "put the leg on the table"]  # a second prompt: each session has its own
    a, b = PolicyClient(server.uri, KEY), PolicyClient(server.uri, KEY)
    try:
        assert a.metadata["cameras"] == list(cfg.data.cameras) and a.metadata["frames_per_chunk"] == F
        got: dict[str, list] = {"a": [], "b": []}
        for client, prompt in ((a, prompts[0]), (b, prompts[1])):
            assert set(client.reset(prompt)) == {"server_timing"}
        for k in range(2):  # interleaved: a's and b's histories never meet
            for name, client, ep in (("a", a, eps[0]), ("b", b, eps[1])):
                reply = client.infer({"obs": ep.video[0], "prompt": "ignored"})  # re-sent, as the clients do
                assert reply["server_timing"]["infer_ms"] > 0
                got[name].append(reply["action"])
            if k == 0:
                for client, ep in ((a, eps[0]), (b, eps[1])):
                    assert "server_timing" in client.infer(_kv(ep, 0, n))
        a.reset(prompts[1])  # a second episode on connection a: episode index 1 of that session
        second = a.infer({"obs": eps[1].video[0]})["action"]
    finally:
        a.close()
        b.close()
    want_a = _expected(model, cfg, data, 0, prompts[0], 0, 2)
    want_b = _expected(model, cfg, data, 1, prompts[1], 0, 2)
    want_second = _expected(model, cfg, data, 1, prompts[1], 1, 1)
    for served, want in ((got["a"], want_a), (got["b"], want_b), ([second], want_second)):
        for s, w in zip(served, want, strict=True):
            assert s.shape == (len(data.slots), F, n) and s.dtype == np.float32 and np.isfinite(s).all()
            np.testing.assert_allclose(s, w, rtol=1e-4, atol=1e-5)
    assert not np.allclose(got["b"][0], want_second[0])  # another seed: the episode index matters


def test_bad_messages_get_an_error_and_the_other_connection_keeps_working(trained, server):
    cfg, data = _eval_data(trained)
    ep = replay_episodes(cfg, data.names[:1])[0]
    frame, n = ep.video[0], N
    c, d = PolicyClient(server.uri, KEY), PolicyClient(server.uri, KEY)

    def other_works() -> None:
        d.reset(cfg.data.prompt)
        assert np.isfinite(d.infer({"obs": frame})["action"]).all()

    def refused(message, field: str) -> str:
        if isinstance(message, bytes):
            c.ws.send(message)
            reply = c.ws.recv()
            assert isinstance(reply, str), reply
            text = reply
        else:
            with pytest.raises(ServerError) as info:
                c.infer(message)
            text = str(info.value)
        assert f"bad request: {field}" in text, text
        other_works()
        return text

    before = sum("bad request" in line for line in server.lines)
    try:
        refused({"obs": frame}, "reset: no episode yet")
        c.reset(cfg.data.prompt)
        refused(b"\xc1 not msgpack", "frame: not a msgpack map")
        refused({"obs": {"color_image2": frame["color_image2"]}}, "obs['color_image1']: missing")
        refused(
            {"obs": {**frame, "color_image9": frame["color_image1"]}}, "obs['color_image9']: unknown camera"
        )
        floats = {**frame, "color_image2": frame["color_image2"].astype(np.float32)}
        assert "float32" in refused({"obs": floats}, "obs['color_image2']: expected an H x W x 3 uint8 image")
        assert c.infer({"obs": frame})["action"].shape == (8, F, n)  # c itself still serves
        bad_state = {**_kv(ep, 0, n), "state": np.zeros((8, F + 1, n), np.float32)}
        assert f"got (8, {F + 1}, {n})" in refused(bad_state, f"state: expected shape (8, {F}, {n})")
        too_few = {**_kv(ep, 0, n), "obs": ep.video[1:3]}  # 2 key frames for one executed latent frame
        refused(
            too_few, f"obs: expected {N} key frames ({N} per executed latent frame x 1 latent frames), got 2"
        )
        assert "server_timing" in c.infer(_kv(ep, 0, n))  # the right one is accepted after it
        small = {k: v[::3, ::2].copy() for k, v in ep.video[0].items()}  # any size is resized
        assert np.isfinite(c.infer({"obs": small})["action"]).all()
    finally:
        c.close()
        d.close()
    assert _said(server, lambda lines: sum("bad request" in line for line in lines) - before >= 7)
    assert server.proc.poll() is None


def _said(server: Served, predicate, timeout: float = 30) -> bool:
    return said(server.lines, predicate, timeout)


def _status(uri: str, key: str | None) -> int:
    with pytest.raises(InvalidStatus) as info:
        PolicyClient(uri, key)
    return info.value.response.status_code


def test_refused_without_the_key_and_beyond_the_limits(server):
    assert _status(server.uri, None) == 401
    assert _status(server.uri, "wrong") == 401
    assert _said(server, lambda lines: any("missing or wrong Authorization" in line for line in lines))
    with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/healthz", timeout=10) as r:
        assert r.status == 200 and r.read() == b"OK\n"
    big = PolicyClient(server.uri, KEY)
    big.ws.send(b"\x00" * (LIMIT + 1))
    with pytest.raises(ConnectionClosedError) as info:
        big.ws.recv()
    assert info.value.rcvd is not None and info.value.rcvd.code == 1009  # message too big
    held: list[PolicyClient] = []
    deadline = time.monotonic() + 30
    try:
        while len(held) < 3 and time.monotonic() < deadline:  # earlier connections may still be closing
            try:
                held.append(PolicyClient(server.uri, KEY))
            except InvalidStatus:
                time.sleep(0.05)  # polling for a closing connection to go, with a deadline
        assert len(held) == 3
        with pytest.raises(InvalidStatus) as refused:
            PolicyClient(server.uri, KEY)
        assert refused.value.response.status_code == 503
        assert b"--max-connections" in refused.value.response.body
    finally:
        for client in held:
            client.close()


def test_replay_through_the_server_scores_as_bin_evaluate(trained, server, tmp_path):
    from trainer.evaluation.cli import held_out

    cfg, data = _eval_data(trained)
    names, _ = held_out(data.names, cfg, None)
    client = PolicyClient(server.uri, KEY)
    try:
        clip = float(getattr(getattr(cfg, "recipe", None), "action_clip", 1.5))
        replay = replay_open_loop(client, replay_episodes(cfg, names), data.normalizer, F, N, clip)
    finally:
        client.close()
    plots = tmp_path / "plots"
    out = subprocess.run(
        [str(REPO / "bin" / "evaluate"), str(trained.best), *set_args(trained.sets),
         "--plots-dir", str(plots), "--json"],
        cwd=REPO, env=trained.env, capture_output=True, text=True, timeout=TIMEOUT,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert not [line for line in out.stderr.splitlines() if "Warning" in line], out.stderr  # issue 30
    result = json.loads(out.stdout)
    ours, theirs = replay["overall"], result["overall"]
    for k in ("chunks", "frames", "actions", "frames_skipped"):
        assert ours[k] == theirs[k], k
    span = data.normalizer.q99 - data.normalizer.q01
    for i, name in enumerate(ours["per_channel"]):  # the robot's channel order (JSON sorts the keys)
        v = theirs["per_channel"][name]
        assert ours["per_channel"][name]["mae_robot"] == pytest.approx(v["mae_robot"], rel=1e-5, abs=1e-7)
        if span[i] > 1e-6:  # a constant channel's normalised prediction cannot be read back from robot units
            assert ours["per_channel"][name]["mae_norm"] == pytest.approx(v["mae_norm"], rel=1e-5)
    assert set(result["plots"]) == set(names)
    for name, path in result["plots"].items():
        assert Path(path).parent == plots and Path(path).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"evaluate: plot {name}: {path}" in out.stderr


def test_camera_aliases_serve_libero_keys_to_a_furniture_run(trained):
    """bin/serve --camera maps LIBERO's client keys to this run's cameras; upstream's LIBERO loop
    (trainer/evaluation/loops.py) then runs two chunks; an unmapped key is an error reply naming both
    sets; bad --camera items exit 2 with one line."""
    from trainer.evaluation.loops import LIBERO_CAMERAS, LIBERO_SIZE, libero_episode
    from trainer.evaluation.standin import StandInSim

    agent, wrist = LIBERO_CAMERAS
    for bad, why in ((["--camera", "no-equals"], "expected CLIENT_KEY=RUN_CAMERA"),
                      (["--camera", f"{agent}=rear", "--camera", f"{wrist}=color_image1"],
                       "'rear' is not one of the run's cameras")):  # fmt: skip
        out = subprocess.run(
            [str(REPO / "bin" / "serve"), str(trained.run_dir), "--port", "0", *bad, *set_args(trained.sets)],
            cwd=REPO, env=trained.env, capture_output=True, text=True, timeout=TIMEOUT,
        )  # fmt: skip
        last = out.stderr.strip().splitlines()[-1]
        assert out.returncode == 2 and why in last and last.startswith("serve: --camera"), out.stderr
    mapped = ["--camera", f"{agent}=color_image2", "--camera", f"{wrist}=color_image1"]
    argv = [
        str(REPO / "bin" / "serve"),
        str(trained.run_dir),
        "--port",
        "0",
        *mapped,
        *set_args(trained.sets),
    ]
    proc = subprocess.Popen(
        argv, cwd=REPO, env=trained.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    lines: list[str] = []
    threading.Thread(target=_pump, args=(proc.stdout, lines), daemon=True).start()
    try:
        aliased = Served(proc, 0, lines)
        assert _said(aliased, lambda got: any("listening on" in line for line in got), TIMEOUT), lines
        port = int(re.findall(r"listening on ws://127\.0\.0\.1:(\d+)", "\n".join(lines))[0])
        client = PolicyClient(f"ws://127.0.0.1:{port}")
        try:
            assert client.metadata["client_cameras"] == {agent: "color_image2", wrist: "color_image1"}
            sim = StandInSim(dict.fromkeys(LIBERO_CAMERAS, LIBERO_SIZE), 8)
            ep = libero_episode(client, sim, "put the leg on the table", (F - 1) * N + F * N)
            assert len(ep.actions) == 2 and ep.key_frames == [N * (F - 1), N * F]
            assert all(a.shape == (8, F, N) and np.isfinite(a).all() for a in ep.actions)
            images = sim.images()
            with pytest.raises(ServerError) as info:
                client.infer({"obs": {**images, "color_image2": images[agent]}})
            text = str(info.value)
            assert "obs['color_image2']: unknown camera" in text and str(list(LIBERO_CAMERAS)) in text
            assert "the run's cameras ['color_image2', 'color_image1']" in text
        finally:
            client.close()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, "\n".join(lines)


def test_sigterm_stops_it_with_exit_0_and_nothing_left(server):
    client = PolicyClient(server.uri, KEY)  # an open connection does not hold the exit
    os.kill(server.proc.pid, signal.SIGTERM)
    assert server.proc.wait(timeout=60) == 0, "\n".join(server.lines)
    with pytest.raises(ProcessLookupError):
        os.killpg(server.proc.pid, 0)  # its process group is empty: nothing left running
    with pytest.raises(OSError):
        PolicyClient(server.uri, KEY, open_timeout=5)
    assert _said(server, lambda lines: any("SIGTERM: stopping" in line for line in lines))
    assert not [line for line in server.lines if "Warning" in line], "\n".join(server.lines)  # issue 30
    client.close()
