"""The websocket policy protocol LingBot-VA's clients speak (openpi's, as upstream 58c2ae5 serves it), the
codec and the checked, typed messages.

Wire format (upstream `wan_va/utils/Simple_Remote_Infer/deploy/`): every frame is msgpack; a numpy array
travels as a map {b"__ndarray__": True, b"data": raw bytes, b"dtype": dtype.str, b"shape": [...]}, a numpy
scalar as {b"__npgeneric__": True, b"data": value, b"dtype": dtype.str}; object, void and complex arrays
are refused. The server sends one metadata map on connect, then answers each request frame with one reply
frame: a map (with `server_timing`) or, for a request it cannot serve, a text frame (a `str`), which
upstream's clients raise on.

Requests (upstream `VA_Server.infer`: the first true flag wins, extra keys are ignored):
    {"reset": True, "prompt": str}             -> Reset: a new episode (no prompt: the run's data.prompt)
        (+ "episode_seed": int >= 0, this project's extension, never sent by upstream's clients: the
        episode's noise index instead of the connection's own episode count, so that clients opening one
        connection per episode, as bin/evaluate --sim does, draw independent noise per episode)
    {"compute_kv_cache": True, "obs": [frame, ...], "state": (C, F', N) float}
                                               -> Executed: the real frames and the executed actions
    {"obs": frame | [frame], ...}              -> Observe: the next chunk of actions
A frame maps each of the run's cameras to an H x W x 3 uint8 image; other keys whose value is an image-like
(3-dimensional) array are unknown cameras (refused), any other key (a state vector, a task string) is
ignored as upstream ignores it. With camera aliases (bin/serve --camera CLIENT_KEY=RUN_CAMERA, Spec.aliases:
upstream's clients key their images as the LeRobot datasets do, e.g. 'observation.images.agentview_rgb')
a frame must carry exactly the aliased client keys, one per run camera; the decoded Frame is keyed by the
run's cameras either way. `decode_request` checks all of this and raises ProtocolError naming the
field and what was expected; the state's frame count is checked against the session (session.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np


class ProtocolError(ValueError):
    """A request that cannot be served: `field` names the part of it, the message what was expected."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field


# -- the codec ---------------------------------------------------------------------------------------
def _pack_default(obj: Any) -> Any:
    if isinstance(obj, np.ndarray | np.generic) and obj.dtype.kind in ("V", "O", "c"):
        raise TypeError(f"numpy dtype {obj.dtype} cannot travel (object, void and complex are refused)")
    if isinstance(obj, np.ndarray):
        data = np.ascontiguousarray(obj)
        return {b"__ndarray__": True, b"data": data.tobytes(), b"dtype": data.dtype.str, b"shape": data.shape}
    if isinstance(obj, np.generic):
        return {b"__npgeneric__": True, b"data": obj.item(), b"dtype": obj.dtype.str}
    raise TypeError(f"{type(obj).__name__} cannot travel in a msgpack frame")


def _array_hook(obj: dict) -> Any:
    if b"__ndarray__" in obj:
        try:
            dtype = np.dtype(obj[b"dtype"])
            if dtype.kind in ("V", "O", "c"):
                raise ValueError(f"dtype {dtype} is refused")
            return np.ndarray(buffer=obj[b"data"], dtype=dtype, shape=tuple(obj[b"shape"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise ProtocolError("array", f"a malformed numpy array entry ({exc})") from exc
    if b"__npgeneric__" in obj:
        try:
            return np.dtype(obj[b"dtype"]).type(obj[b"data"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ProtocolError("array", f"a malformed numpy scalar entry ({exc})") from exc
    return obj


def pack(obj: Any) -> bytes:
    return msgpack.packb(obj, default=_pack_default, use_bin_type=True)


def unpack(data: bytes) -> Any:
    """One frame -> Python objects with numpy arrays; ProtocolError when it is not msgpack."""
    if not data:  # msgpack says only "incomplete input"
        raise ProtocolError("frame", "an empty frame (0 bytes): expected a msgpack map")
    try:
        return msgpack.unpackb(data, object_hook=_array_hook, raw=False, strict_map_key=False)
    except ProtocolError:
        raise
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        why = f"{type(exc).__name__}: {exc}" if str(exc) else f"{type(exc).__name__} at byte 0x{data[0]:02x}"
        raise ProtocolError("frame", f"not a msgpack map ({why}; {len(data)} bytes)") from exc


# -- messages ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Spec:
    """What a request must hold for one served run."""

    cameras: tuple[str, ...]
    channels: int  # robot action channels (model.action_used)
    frames_per_chunk: int
    actions_per_frame: int
    aliases: tuple[tuple[str, str], ...] = ()  # (client key, run camera), one per run camera; () none

    @property
    def client_cameras(self) -> tuple[str, ...]:
        """The image keys a frame must carry: the aliased client keys, else the run's cameras."""
        if not self.aliases:
            return self.cameras
        by_camera = {cam: key for key, cam in self.aliases}
        return tuple(by_camera[cam] for cam in self.cameras)


Frame = dict[str, np.ndarray]  # camera -> (H, W, 3) uint8


@dataclass(frozen=True)
class Reset:
    prompt: str | None
    episode_seed: int | None = None


@dataclass(frozen=True)
class Observe:
    frame: Frame | None  # None: no `obs` (only a first chunk needs one)


@dataclass(frozen=True)
class Executed:
    frames: list[Frame]
    state: np.ndarray  # (C, F', N) float32, robot units


Request = Reset | Observe | Executed


def _key(k: Any) -> str:
    return k.decode(errors="replace") if isinstance(k, bytes) else str(k)


def _expected_keys(spec: Spec) -> str:
    if not spec.aliases:
        return f"this run's cameras are {list(spec.cameras)}"
    mapped = ", ".join(f"{key!r} -> {cam!r}" for key, cam in spec.aliases)
    return (
        f"expected the client keys {list(spec.client_cameras)} (bin/serve --camera: {mapped}) "
        f"for the run's cameras {list(spec.cameras)}"
    )


def check_frame(raw: Any, where: str, spec: Spec) -> Frame:
    if not isinstance(raw, dict):
        raise ProtocolError(where, f"expected a map of camera -> image, got {type(raw).__name__}")
    items = {_key(k): v for k, v in raw.items()}
    keys = spec.client_cameras
    unknown = [k for k, v in items.items() if k not in keys and isinstance(v, np.ndarray) and v.ndim == 3]
    if unknown:
        raise ProtocolError(f"{where}[{unknown[0]!r}]", f"unknown camera; {_expected_keys(spec)}")
    frame: Frame = {}
    for cam, key in zip(spec.cameras, keys, strict=True):
        if key not in items:
            raise ProtocolError(f"{where}[{key!r}]", f"missing; {_expected_keys(spec)}")
        img = items[key]
        if not isinstance(img, np.ndarray) or img.dtype != np.uint8 or img.ndim != 3 or img.shape[2] != 3:
            got = f"{img.dtype} {tuple(img.shape)}" if isinstance(img, np.ndarray) else type(img).__name__
            raise ProtocolError(
                f"{where}[{key!r}]", f"expected an H x W x 3 uint8 image (any H, W: resized), got {got}"
            )
        if img.shape[0] < 1 or img.shape[1] < 1:
            raise ProtocolError(f"{where}[{key!r}]", f"expected a non-empty image, got {tuple(img.shape)}")
        frame[cam] = img
    return frame


def _frames(raw: Any, spec: Spec) -> list[Frame]:
    items = raw if isinstance(raw, list | tuple) else [raw]
    return [check_frame(x, f"obs[{i}]", spec) for i, x in enumerate(items)]


def check_state(raw: Any, spec: Spec, frames: int) -> np.ndarray:
    want = (spec.channels, frames, spec.actions_per_frame)
    shape_text = f"(channels {want[0]}, frames {want[1]}, actions per frame {want[2]})"
    if not isinstance(raw, np.ndarray) or raw.dtype.kind not in "fiu":
        got = f"{raw.dtype}" if isinstance(raw, np.ndarray) else type(raw).__name__
        raise ProtocolError("state", f"expected a numeric array {shape_text}, got {got}")
    if tuple(raw.shape) != want:
        raise ProtocolError("state", f"expected shape {want} {shape_text}, got {tuple(raw.shape)}")
    state = raw.astype(np.float32)
    if not np.isfinite(state).all():
        raise ProtocolError("state", "expected finite values, got NaN or inf")
    return state


def _flag(msg: dict, key: str) -> bool:
    """A request's boolean field (absent: false). Anything else is a bad request naming it: an array here
    was numpy's "truth value ... is ambiguous", answered as a server error (found by a review)."""
    value = msg.get(key)
    if value is None or isinstance(value, bool | int | np.bool_) and value in (0, 1):
        return bool(value)
    raise ProtocolError(key, f"expected true or false, got {type(value).__name__} {value!r}"[:200])


def decode_request(data: bytes | str, spec: Spec) -> Request:
    """One request frame -> Reset | Observe | Executed (the state's shape is checked by the session)."""
    if isinstance(data, str):
        raise ProtocolError("frame", "expected a binary msgpack frame, got a text frame")
    msg = unpack(data)
    if not isinstance(msg, dict):
        raise ProtocolError("frame", f"expected a msgpack map, got {type(msg).__name__}")
    msg = {_key(k): v for k, v in msg.items()}
    if _flag(msg, "reset"):
        prompt = msg.get("prompt")
        if isinstance(prompt, list | tuple) and len(prompt) == 1:  # openpi clients send ["text"]
            prompt = prompt[0]
        if prompt is not None and not isinstance(prompt, str):
            raise ProtocolError("prompt", f"expected a string, got {type(prompt).__name__}")
        seed = msg.get("episode_seed")
        if seed is not None and (
            isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0
        ):
            raise ProtocolError("episode_seed", f"expected an integer >= 0, got {seed!r}")
        return Reset(prompt, None if seed is None else int(seed))
    if _flag(msg, "compute_kv_cache"):
        if "obs" not in msg:
            raise ProtocolError("obs", "compute_kv_cache needs the executed frames (a list of frames)")
        if "state" not in msg:
            raise ProtocolError("state", "compute_kv_cache needs the executed actions (channels, frames, N)")
        state = msg["state"]
        if not isinstance(state, np.ndarray):
            raise ProtocolError("state", f"expected a numeric array, got {type(state).__name__}")
        return Executed(_frames(msg["obs"], spec), state)
    if "obs" not in msg:
        return Observe(None)
    obs = msg["obs"]
    if isinstance(obs, list | tuple):
        if len(obs) != 1:
            raise ProtocolError("obs", f"expected one frame (a map, or a list of one), got {len(obs)}")
        obs = obs[0]
    return Observe(check_frame(obs, "obs", spec))


def parse_aliases(
    items: list[str] | tuple[str, ...], cameras: tuple[str, ...]
) -> tuple[tuple[str, str], ...]:
    """bin/serve's --camera CLIENT_KEY=RUN_CAMERA items -> Spec.aliases; ValueError (one line) when an
    item is malformed, names a camera the run lacks, repeats a key or a camera, or leaves a camera out."""
    out: list[tuple[str, str]] = []
    for item in items:
        key, sep, cam = item.partition("=")
        key, cam = key.strip(), cam.strip()
        if not sep or not key or not cam:
            raise ValueError(f"--camera {item!r}: expected CLIENT_KEY=RUN_CAMERA")
        if cam not in cameras:
            raise ValueError(f"--camera {item!r}: {cam!r} is not one of the run's cameras {list(cameras)}")
        out.append((key, cam))
    keys, cams = [k for k, _ in out], [c for _, c in out]
    for what, names in (("client key", keys), ("run camera", cams)):
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"--camera: the {what} {twice[0]!r} is mapped twice")
    missing = [c for c in cameras if c not in cams]
    if out and missing:
        raise ValueError(
            f"--camera: no client key for the run's camera(s) {missing}; map every one of {list(cameras)}"
        )
    return tuple(out)


def metadata(spec: Spec, extra: dict | None = None) -> dict:
    """The map sent on connect (upstream sends an empty one; its clients read and ignore it)."""
    return {
        "server": "lingbot-env bin/serve",
        "cameras": list(spec.cameras),
        **({"client_cameras": dict(spec.aliases)} if spec.aliases else {}),
        "action_shape": ["channels", "frames", "actions_per_frame"],
        "channels": spec.channels,
        "frames_per_chunk": spec.frames_per_chunk,
        "actions_per_frame": spec.actions_per_frame,
        **(extra or {}),
    }


def action_layout(robot: np.ndarray, frames: int, per_frame: int) -> np.ndarray:
    """[F*N, C] robot-unit actions -> (C, F, N), the layout upstream's clients index as action[:, i, j]."""
    return np.ascontiguousarray(robot.reshape(frames, per_frame, -1).transpose(2, 0, 1), dtype=np.float32)


def state_rows(state: np.ndarray) -> np.ndarray:
    """(C, F, N) -> [F*N, C], the inverse of action_layout."""
    c = state.shape[0]
    return np.ascontiguousarray(state.transpose(1, 2, 0).reshape(-1, c))
