"""bin/serve's server in one process (trainer/serving/server.py, session.py) on a tiny random model: the
handshake refuses a wrong key before any session exists, a session answers reset -> observation ->
compute_kv_cache -> observation with what a Session computes directly, a bad request is answered and the
connection goes on, a frame over the limit closes the connection (1009), stop() returns 0. The end-to-end
test with bin/train and bin/serve is tests/test_serve.py (heavy)."""

import asyncio
import threading

import numpy as np
import pytest
import torch
from websockets.exceptions import ConnectionClosedError, InvalidStatus

from tests.support.lingbot_tiny import tiny_cfg
from tests.support.serve_tiny import tiny_served
from trainer.data.encoding.encoder import make_encoder
from trainer.data.encoding.text import StandInText
from trainer.data.normalize import QuantileNormalizer
from trainer.model import WorldModel
from trainer.recipe.batch import ACTION_SLOTS, action_slot_mask
from trainer.serving.client import PolicyClient, ServerError
from trainer.serving.protocol import ProtocolError, Spec
from trainer.serving.server import Limits, PolicyServer
from trainer.serving.session import Served, Session

pytestmark = pytest.mark.fast
F, CAMS, KEY = 2, ("front", "wrist"), "abc123"


def _served() -> Served:
    return tiny_served()  # tests/support/serve_tiny.py: 2 cameras (front, wrist), 8 channels, F = 2


@pytest.fixture(scope="module")
def running():
    served, lines = _served(), []
    server = PolicyServer(served, Limits(KEY, 2, 64 * 1024), lines.append)
    bound, result = threading.Event(), []
    thread = threading.Thread(
        target=lambda: result.append(asyncio.run(server.run("127.0.0.1", 0, lambda p: bound.set(), False)))
    )
    thread.start()
    assert bound.wait(60)
    yield served, server, lines
    server.stop()
    thread.join(60)
    assert result == [0] and lines[-1] == "serve: stopped"


def _frames(count: int, seed: int = 0, cams: tuple[str, ...] = CAMS):
    rng = np.random.default_rng(seed)
    return [{c: rng.integers(0, 256, (24, 20, 3), dtype=np.uint8) for c in cams} for _ in range(count)]


def test_a_wrong_key_is_refused_in_the_handshake(running):
    _, server, lines = running
    for key in (None, "nope"):
        with pytest.raises(InvalidStatus) as info:
            PolicyClient(f"ws://127.0.0.1:{server.port}", key)
        assert info.value.response.status_code == 401
    assert server.open == 0 and not any("opened" in line for line in lines)  # no session was made


def test_a_session_serves_what_a_session_computes_and_survives_bad_requests(running):
    served, server, lines = running
    n = served.spec.actions_per_frame
    frames = _frames(2 * F)
    state = np.random.default_rng(1).normal(size=(8, F, n)).astype(np.float32)
    direct = Session(served)
    direct.reset("pick it up")
    want0 = direct.observe(frames[0])
    direct.executed(frames[1:F], state)
    want1 = direct.observe(frames[F])
    client = PolicyClient(f"ws://127.0.0.1:{server.port}", KEY)
    try:
        assert client.metadata["cameras"] == list(CAMS) and client.metadata["channels"] == 8
        with pytest.raises(ServerError, match="reset: no episode yet"):
            client.infer({"obs": frames[0]})
        client.reset("pick it up")
        got0 = client.infer({"obs": frames[0]})
        with pytest.raises(ServerError, match=r"state: expected shape \(8, 2, 3\)"):
            client.infer({"obs": frames[1:F], "compute_kv_cache": True, "state": state[:, :1]})
        client.infer({"obs": frames[1:F], "compute_kv_cache": True, "state": state})
        got1 = client.infer({"obs": frames[F]})
    finally:
        client.close()
    assert got0["action"].shape == (8, F, n) and set(got0["server_timing"]) >= {"infer_ms", "queue_ms"}
    np.testing.assert_allclose(got0["action"], want0, rtol=0, atol=1e-6)
    np.testing.assert_allclose(got1["action"], want1, rtol=0, atol=1e-6)
    assert sum("bad request" in line for line in lines) == 2


def test_a_frame_over_the_limit_closes_the_connection(running):
    _, server, lines = running
    client = PolicyClient(f"ws://127.0.0.1:{server.port}", KEY)
    client.ws.send(b"\x00" * (64 * 1024 + 1))
    with pytest.raises(ConnectionClosedError) as info:
        client.ws.recv()
    assert info.value.rcvd is not None and info.value.rcvd.code == 1009


def _streaming(layout: str, cams: tuple[str, ...]) -> Served:
    """A Served at the clients' cadence: t = 4 key frames per latent frame (N = 4), F = 3, the run's
    layout, standardised latents (the stand-in's statistics)."""
    f, t = 3, 4
    cfg = tiny_cfg(
        **{"infer.frames_per_chunk": f, "infer.video_steps": 1, "infer.action_steps": 1},
        **{"data.actions_per_frame": t, "data.layout": layout, "data.cameras": list(cams)},
        **{"data.format": "lerobot"},
    )
    torch.manual_seed(0)
    model = WorldModel(cfg).eval()
    m = cfg.model
    text = StandInText(m.text_dim, 8)
    empty, _ = text.embed("")
    norm = QuantileNormalizer(
        np.linspace(-1, 0, 8).astype(np.float32), np.linspace(1, 2, 8).astype(np.float32)
    )
    from trainer.data.encoding.views import grid

    h, w = grid(cfg)
    c = m.latent_channels
    stats = (np.linspace(-0.1, 0.1, c).reshape(1, c, 1, 1), np.linspace(0.5, 2, c).reshape(1, c, 1, 1))
    return Served(
        model, cfg, "tiny", norm, tuple(ACTION_SLOTS), action_slot_mask(m.action_dim, 8),
        torch.as_tensor(empty), (c, h, w), stats, make_encoder(cfg), text, Spec(cams, 8, f, t),
    )  # fmt: skip


@pytest.mark.parametrize(
    ("layout", "cams"),
    [
        ("side_by_side", ("observation.images.agentview_rgb", "observation.images.eye_in_hand_rgb")),
        (
            "tshape",
            (
                "observation.images.cam_high",
                "observation.images.cam_left_wrist",
                "observation.images.cam_right_wrist",
            ),
        ),
    ],
)
def test_streamed_key_frames_give_the_runs_training_latents(layout, cams):
    """A Session fed as upstream's clients feed it (the observation alone, then t x (F - 1) key frames,
    then t x F per chunk) puts in its cache exactly the latents training's cache holds for the whole video:
    each camera's `encode` (the wrists resized for the T-shape), views.compose'd and standardised."""
    from trainer.data.encoding.views import compose, view_sizes

    served = _streaming(layout, cams)
    f, t = served.spec.frames_per_chunk, served.temporal
    chunks = 3
    video = _frames(1 + t * (f * chunks - 1), 3, cams)  # 24 x 20 images: the stand-in pools any size
    session = Session(served)
    session.reset("stack the blocks")
    seen: list[torch.Tensor] = []
    observe = session._sampler().observe
    session._sampler().observe = lambda lat, act: (seen.append(lat.clone()), observe(lat, act))[1]
    state = np.zeros((8, f, t), np.float32)
    pushed = 1
    for k in range(chunks):
        session.observe(video[0])  # the clients re-send the first observation; only chunk 0 uses it
        count = t * (f - 1 if k == 0 else f)
        session.executed(video[pushed : pushed + count], state)
        pushed += count
    streamed = torch.cat(seen).numpy()
    enc = served.video
    per_camera = []
    for cam, (h, w) in zip(cams, view_sizes(served.cfg), strict=True):
        one = enc if (h, w) == (enc.latent_side, enc.latent_width) else enc.resized(h, w)
        per_camera.append(one.encode(np.stack([fr[cam] for fr in video])))
    mean, std = served.latent_stats
    want = (compose(per_camera, layout) - mean) / std
    assert streamed.shape == want.shape == (f * chunks, *served.grid)
    np.testing.assert_allclose(streamed, want, rtol=1e-5, atol=1e-6)


def test_a_wrong_key_frame_count_is_refused_and_the_episode_goes_on():
    served = _streaming(
        "side_by_side", ("observation.images.agentview_rgb", "observation.images.eye_in_hand_rgb")
    )
    f, t = served.spec.frames_per_chunk, served.temporal
    video = _frames(1 + t * (2 * f - 1), 4, served.spec.cameras)
    state = np.zeros((8, f, t), np.float32)
    session = Session(served)
    session.reset(None)
    session.observe(video[0])
    session.observe(video[0])  # a second plain request in the first chunk: latent frame 0 again
    before = [s.pushed for s in session.streams]
    assert before == [1, 1]
    for wrong in (f - 1, t * (f - 1) - 1, t * f):
        with pytest.raises(ProtocolError, match=rf"expected {t * (f - 1)} key frames \({t} per executed "
                           rf"latent frame x {f - 1} latent frames\), got {wrong}") as info:  # fmt: skip
            session.executed(video[1 : 1 + wrong], state)
        assert info.value.field == "obs" and [s.pushed for s in session.streams] == before
    session.executed(video[1 : 1 + t * (f - 1)], state)
    assert np.isfinite(session.observe(video[0])).all()
    with pytest.raises(ProtocolError, match=rf"expected {t * f} key frames .* x {f} latent frames\), got 3"):
        session.executed(video[:3], state)
    session.executed(video[1 + t * (f - 1) :], state)
    assert [s.pushed for s in session.streams] == [len(video)] * 2 and session.chunk == 2


def test_actions_that_are_not_finite_are_never_sent():
    """A broken checkpoint or normaliser gives NaN actions: an error (the server's 'server error' reply,
    which upstream's clients raise), nothing pending, and the next request may try again."""
    served = _served()
    served.normalizer = QuantileNormalizer(np.full(8, np.nan, np.float32), np.ones(8, np.float32))
    session = Session(served)
    session.reset(None)
    with pytest.raises(FloatingPointError, match="not finite.*nothing was sent"):
        session.observe(_frames(1)[0])
    assert not session.pending and session.sampler is not None and session.sampler.frame == 0


def test_a_resets_episode_seed_chooses_the_noise_and_a_bad_one_is_refused():
    """Two connections that each run one episode draw the same noise (each is its connection's episode 0),
    unless the reset carries episode_seed (bin/evaluate --sim sends one per episode); a bad seed is refused
    naming the field."""
    from trainer.serving.protocol import decode_request, pack

    served = _served()
    frame = _frames(1)[0]

    def first_chunk(episode_seed=None) -> np.ndarray:
        session = Session(served)  # a connection of its own
        session.reset("p", episode_seed)
        return session.observe(frame)

    np.testing.assert_array_equal(first_chunk(), first_chunk())
    seven, eight = first_chunk(7), first_chunk(8)
    np.testing.assert_array_equal(seven, first_chunk(7))
    assert not np.array_equal(seven, eight)
    assert decode_request(pack({"reset": True, "episode_seed": np.int64(7)}), served.spec).episode_seed == 7
    for bad in (-1, 1.5, "7", True):
        with pytest.raises(ProtocolError) as info:
            decode_request(pack({"reset": True, "prompt": "p", "episode_seed": bad}), served.spec)
        assert info.value.field == "episode_seed"


def test_a_non_finite_chunk_is_the_libero_episodes_failure_with_its_reason():
    """Issue 56 item 1: the server's refusal of a non-finite chunk (a server error the client raises)
    ends a LIBERO worker's episode as a failure with that reason (trainer/evaluation/sim/worker.py play:
    upstream's loop on the worker's own client), not a worker crash; an episode the policy plays to the step
    limit is a failure naming it (tests/test_sim_libero.py); another server error stays an error. A real
    server (tiny model, its normaliser NaN) and the stand-in simulator with LIBERO's camera keys."""
    from dataclasses import replace

    from trainer.evaluation.loops import LIBERO_CAMERAS, LIBERO_SIZE
    from trainer.evaluation.sim.worker import TimedClient, play
    from trainer.evaluation.standin import StandInSim

    served = _served()
    served.spec = replace(served.spec, aliases=tuple(zip(LIBERO_CAMERAS, CAMS, strict=True)))
    finite = served.normalizer
    server = PolicyServer(served, Limits(None, 2, 1 << 22), lambda line: None)
    bound = threading.Event()
    thread = threading.Thread(
        target=lambda: asyncio.run(server.run("127.0.0.1", 0, lambda p: bound.set(), False))
    )
    thread.start()
    sim = StandInSim(dict.fromkeys(LIBERO_CAMERAS, LIBERO_SIZE), 8)
    try:
        assert bound.wait(60)
        uri = f"ws://127.0.0.1:{server.port}"
        served.normalizer = QuantileNormalizer(np.full(8, np.nan, np.float32), np.ones(8, np.float32))
        success, chunks, reason = play(TimedClient(uri), sim, "pick it up", 40, 7)
        assert (success, chunks) == (False, 0)
        assert reason.startswith("the served actions were not finite: chunk 0 of episode 7"), reason
        served.normalizer = finite
        other = StandInSim(dict.fromkeys(("left", "right"), LIBERO_SIZE), 8)  # cameras it does not serve
        with pytest.raises(ServerError, match="left"):
            play(TimedClient(uri), other, "pick it up", 10, 7)
    finally:
        server.stop()
        thread.join(60)


def test_a_replayed_demo_reaches_the_client_loops_env_step_unchanged_and_each_fault_changes_it():
    """tests/support/replay.py's chunks through the session's own decoding (to_robot_units, action_layout),
    the wire (pack, decode_request, the server's _run) and upstream's LIBERO client loop
    (loops.libero_episode): the env steps exactly the demo's actions, in order, across the first chunk's
    unexecuted frame 0 and every later chunk; each injected fault changes them. What they do in LIBERO's
    simulator: tests/test_sim_training.py (heavy)."""
    from tests.support.replay import FAULTS, replaying
    from trainer.evaluation.loops import libero_episode
    from trainer.serving.protocol import decode_request, pack, unpack
    from trainer.serving.server import _run

    base = tiny_served(4, **{"data.actions_per_frame": 4})
    low, high = base.normalizer.q01, base.normalizer.q99
    demo = np.random.default_rng(3).uniform(low, high, (29, 8)).astype(np.float32)  # 29: chunks 4 + 8 + ...
    served = replaying(base, demo, list(FAULTS))
    frame = _frames(1)[0]

    class Client:  # one connection: a session of its own, every message through the wire's encoding
        def __init__(self):
            self.session = Session(served)

        def infer(self, obs: dict) -> dict:
            return unpack(pack(_run(self.session, decode_request(pack(obs), served.spec))[0]))

    class Sim:  # the simulator's side of the loop: done once the demo's length is stepped
        timestep = 0

        def __init__(self):
            self.stepped: list[np.ndarray] = []

        def reset(self):
            return frame

        def step(self, action):
            self.stepped.append(np.asarray(action))
            self.timestep += 1
            return frame, len(self.stepped) == len(demo)

    stepped = {}
    for fault in FAULTS:
        sim = Sim()
        assert libero_episode(Client(), sim, "p", max_steps=len(demo)).done
        stepped[fault] = np.stack(sim.stepped)
    np.testing.assert_allclose(stepped[""], demo, atol=1e-5)
    assert served.sources[0].clipped == 0
    for fault in FAULTS[1:]:
        assert not np.allclose(stepped[fault], demo, atol=1e-3), fault
    np.testing.assert_allclose(stepped["gripper"][:, :6], demo[:, :6], atol=1e-5)  # only the gripper moved
    np.testing.assert_allclose(stepped["shift"][:3], demo[1:4], atol=1e-5)  # one key frame (N // 4 = 1) ahead
