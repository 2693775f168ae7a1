"""bin/serve driven by upstream's own client loops (trainer/evaluation/loops.py: LIBERO's `run_one`,
RoboTwin's `eval_policy`, line by line, on a stand-in simulator) at their benchmarks' geometry, on runs of
the `libero` and `robotwin` presets trained by bin/train at CPU scale (tests/support/presets_data.py: one
tiny run per preset per test run, on LeRobot datasets in those layouts).

LIBERO: the preset's cameras are the client's keys ('observation.images.agentview_rgb', '..eye_in_hand_rgb'),
7 channels, F = 4, N = 4 (four key frames per latent frame, one per action), 128 x 128 images: two
connections at once through three chunks each; the `done` ending; a wrong key-frame count answered with an
error after which the same connection completes its chunk. RoboTwin: three cameras in the T-shape, 16
channels (the quaternion branch: add_init_pose, normalised quaternions), F = 2, N = 16 (a key frame every
4 actions). The infer steps are cut to 2 + 2 for time. The mapping of other camera names (--camera) is in
tests/test_serve.py (a FurnitureBench run served to LIBERO's keys).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from tests.support.runs import REPO, TIMEOUT, clean_env, said, set_args
from trainer.evaluation.loops import (
    LIBERO_CAMERAS,
    LIBERO_SIZE,
    libero_episode,
    robotwin_episode,
)
from trainer.evaluation.standin import RoboTwinSim, StandInSim
from trainer.serving.client import PolicyClient, ServerError

pytestmark = pytest.mark.heavy
INFER = ["infer.video_steps=2", "infer.action_steps=2"]
PRESETS = REPO / "trainer" / "config" / "presets"


def _start(run_dir: Path, data_dir: Path, root: Path, *extra: str) -> tuple[subprocess.Popen, int, list[str]]:
    argv = [str(REPO / "bin" / "serve"), str(run_dir), "--port", "0", *extra,
            *set_args([f"data.path={data_dir}", *INFER])]  # fmt: skip
    proc = subprocess.Popen(
        argv, cwd=REPO, env=clean_env(root / "no-envs"), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, start_new_session=True,
    )  # fmt: skip
    lines: list[str] = []

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))

    threading.Thread(target=pump, daemon=True).start()
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline and proc.poll() is None:
        found = [m for line in list(lines) if (m := re.search(r"listening on ws://127\.0\.0\.1:(\d+)", line))]
        if found:
            return proc, int(found[0].group(1)), lines
        time.sleep(0.05)  # polling for the ready line, with a deadline
    raise AssertionError(f"bin/serve exited {proc.poll()} or never listened:\n" + "\n".join(lines))


def _stop(proc: subprocess.Popen, lines: list[str]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, "\n".join(lines)


@pytest.fixture(scope="module")
def libero(tmp_path_factory, preflight_record):
    from tests.support.presets_data import trained

    run_dir, data_dir = trained(tmp_path_factory, "libero", preflight_record)
    proc, port, lines = _start(run_dir, data_dir, tmp_path_factory.mktemp("serve-libero"))
    yield f"ws://127.0.0.1:{port}", lines
    _stop(proc, lines)
    assert not [line for line in lines if "Warning" in line], "\n".join(lines)


def _libero_sim(seed: int, done_at: int | None = None) -> StandInSim:
    return StandInSim(dict.fromkeys(LIBERO_CAMERAS, LIBERO_SIZE), 7, done_at, seed)


def test_libero_client_two_connections_three_chunks(libero):
    uri, lines = libero
    f, n = 4, 4
    steps = (f - 1) * n + 2 * f * n  # the first chunk executes F - 1 latent frames, the others F: 3 chunks
    results: dict[int, object] = {}

    def drive(i: int) -> None:
        client = PolicyClient(uri)
        try:
            assert client.metadata["cameras"] == list(LIBERO_CAMERAS)
            results[i] = libero_episode(client, _libero_sim(i), f"put the bowl on the plate {i}", steps)
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            results[i] = exc
        finally:
            client.close()

    threads = [threading.Thread(target=drive, args=(i,)) for i in range(2)]  # both at once: two sessions
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT)
    for i in range(2):
        ep = results[i]
        assert not isinstance(ep, BaseException), repr(ep)
        assert len(ep.actions) == 3 and ep.key_frames == [4 * (f - 1), 4 * f, 4 * f] and not ep.done  # type: ignore[union-attr]
        for a in ep.actions:  # type: ignore[union-attr]
            assert a.shape == (7, f, n) and a.dtype == np.float32 and np.isfinite(a).all()
    assert not any("bad request" in line or "failed" in line for line in lines), "\n".join(lines)
    # each request's log line follows its reply: the last one may reach `lines` after the client is done
    assert said(lines, lambda got: sum("compute_kv_cache" in line for line in got) >= 6), "\n".join(lines)


def test_libero_client_stops_on_done_and_the_next_episode_serves(libero):
    uri, _ = libero
    client = PolicyClient(uri)
    try:
        ep = libero_episode(client, _libero_sim(5, done_at=20), "open the drawer", 800)
        assert ep.done and len(ep.actions) == 2 and ep.key_frames == [12]  # done inside the second chunk
        again = libero_episode(client, _libero_sim(6), "open the drawer", 12)
        assert len(again.actions) == 1 and np.isfinite(again.actions[0]).all()
    finally:
        client.close()


def test_a_wrong_key_frame_count_is_refused_and_the_chunk_completes(libero):
    uri, _ = libero
    sim, n = _libero_sim(7), 4
    client = PolicyClient(uri)
    try:
        first = sim.reset()
        client.infer({"reset": True, "prompt": "stack the cups"})
        action = client.infer({"obs": first})["action"]
        frames = [sim.step(action[:, 1 + k // n, k % n])[0] for k in range(3 * n)]
        for wrong in (frames[:3], frames[:-1], [*frames, frames[0]]):
            with pytest.raises(ServerError) as info:
                client.infer({"obs": wrong, "compute_kv_cache": True, "imagine": False, "state": action})
            want = "obs: expected 12 key frames (4 per executed latent frame x 3 latent frames), got"
            assert f"{want} {len(wrong)}" in str(info.value)
        client.infer({"obs": frames, "compute_kv_cache": True, "imagine": False, "state": action})
        action = client.infer({"obs": first})["action"]
        frames = [sim.step(action[:, k // n, k % n])[0] for k in range(4 * n)]
        with pytest.raises(ServerError, match="expected 16 key frames .* x 4 latent frames\\), got 12"):
            client.infer({"obs": frames[:12], "compute_kv_cache": True, "state": action})
        client.infer({"obs": frames, "compute_kv_cache": True, "imagine": False, "state": action})
        assert np.isfinite(client.infer({"obs": first})["action"]).all()
    finally:
        client.close()


def test_robotwin_client_at_its_geometry(tmp_path_factory, preflight_record):
    if not (PRESETS / "robotwin.yaml").is_file():
        pytest.skip("trainer/config/presets/robotwin.yaml does not exist: no RoboTwin run to serve")
    from tests.support.presets_data import trained

    run_dir, data_dir = trained(tmp_path_factory, "robotwin", preflight_record)
    proc, port, lines = _start(run_dir, data_dir, tmp_path_factory.mktemp("serve-robotwin"))
    try:
        f, n = 2, 16
        client = PolicyClient(f"ws://127.0.0.1:{port}")
        try:
            ep = robotwin_episode(client, RoboTwinSim(step_lim=(f - 1) * n + 2 * f * n), "lift the pot")
        finally:
            client.close()
        assert len(ep.actions) == 3 and ep.key_frames == [4 * (f - 1), 4 * f, 4 * f]
        for a in ep.actions:
            assert a.shape == (16, f, n) and a.dtype == np.float32 and np.isfinite(a).all()
        assert not any("bad request" in line or "failed" in line for line in lines), "\n".join(lines)
    finally:
        _stop(proc, lines)
