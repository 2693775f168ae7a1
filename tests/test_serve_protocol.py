"""bin/serve's wire format and request checks (trainer/serving/protocol.py), without a server: the
msgpack-numpy codec in openpi's layout, each kind of bad request named by its field, the action layout
upstream's clients index, and the DCP load that prints no library warning (issue 30)."""

import json
import re
import warnings

import msgpack
import numpy as np
import pytest
import torch

from tests.support.lingbot_tiny import tiny_cfg
from trainer.serving.protocol import (
    Executed,
    Observe,
    ProtocolError,
    Reset,
    Spec,
    action_layout,
    check_state,
    decode_request,
    pack,
    parse_aliases,
    state_rows,
    unpack,
)

pytestmark = pytest.mark.fast
SPEC = Spec(("front", "wrist"), channels=8, frames_per_chunk=4, actions_per_frame=2)


def _img(h=32, w=40, dtype=np.uint8):
    return np.arange(h * w * 3, dtype=np.int64).reshape(h, w, 3).astype(dtype)


def _frame(**extra):
    return {"front": _img(), "wrist": _img(20, 20), **extra}


def test_arrays_travel_in_openpis_layout_and_back():
    arrays = {"u8": _img(), "f32": np.linspace(0, 1, 6, dtype=np.float32).reshape(2, 3), "i64": np.arange(3)}
    obj = {**arrays, "scalar": np.float32(2.5), "nested": [{"x": np.ones((2, 2), np.float16)}], "s": "text"}
    wire = pack(obj)
    raw = msgpack.unpackb(wire, raw=True)  # what any msgpack reader sees: openpi's map
    entry = raw[b"u8"]
    assert entry[b"__ndarray__"] is True and entry[b"dtype"] == b"|u1" and entry[b"shape"] == [32, 40, 3]
    assert entry[b"data"] == arrays["u8"].tobytes()
    back = unpack(wire)
    for k, v in arrays.items():
        assert back[k].dtype == v.dtype and np.array_equal(back[k], v), k
    assert back["scalar"] == np.float32(2.5) and back["scalar"].dtype == np.float32
    assert back["nested"][0]["x"].dtype == np.float16 and back["s"] == "text"
    with pytest.raises(TypeError, match="object"):
        pack({"bad": np.array([object()], dtype=object)})
    fortran = np.asfortranarray(np.arange(12, dtype=np.float32).reshape(3, 4))
    assert np.array_equal(unpack(pack(fortran)), fortran)


def test_requests_decode_to_typed_messages():
    assert decode_request(pack({"reset": True, "prompt": "stack it"}), SPEC) == Reset("stack it")
    assert decode_request(pack({"reset": True, "prompt": ["stack it"]}), SPEC) == Reset("stack it")
    assert decode_request(pack({"reset": True}), SPEC) == Reset(None)
    obs = decode_request(pack({"obs": _frame(**{"observation.state": np.zeros(8), "task": "t"})}), SPEC)
    assert isinstance(obs, Observe) and obs.frame is not None and set(obs.frame) == {"front", "wrist"}
    listed = decode_request(pack({"obs": [_frame()], "prompt": "p"}), SPEC)
    assert isinstance(listed, Observe) and listed.frame is not None
    assert all(np.array_equal(listed.frame[k], obs.frame[k]) for k in obs.frame)
    assert decode_request(pack({"prompt": "p"}), SPEC) == Observe(None)
    kv = decode_request(
        pack(
            {
                "obs": [_frame(), _frame()],
                "compute_kv_cache": True,
                "imagine": False,
                "state": np.zeros((8, 2, 2)),
            }
        ),
        SPEC,
    )
    assert isinstance(kv, Executed) and len(kv.frames) == 2 and kv.state.shape == (8, 2, 2)


@pytest.mark.parametrize(
    ("message", "field", "expected"),
    [
        (b"\xc1\x00garbage", "frame", "not a msgpack map (FormatError at byte 0xc1; 9 bytes)"),
        (b"", "frame", "an empty frame (0 bytes)"),  # was "(ValueError: Unpack failed: incomplete input)"
        (pack([1, 2]), "frame", "expected a msgpack map"),
        (pack({"obs": {"front": _img()}}), "obs['wrist']", "missing"),
        (pack({"obs": _frame(rear=_img())}), "obs['rear']", "unknown camera"),
        (
            pack({"obs": {"front": _img(dtype=np.float32), "wrist": _img()}}),
            "obs['front']",
            "H x W x 3 uint8",
        ),
        (
            pack({"obs": {"front": _img()[..., :2].copy(), "wrist": _img()}}),
            "obs['front']",
            "H x W x 3 uint8",
        ),
        (pack({"obs": {"front": "a picture", "wrist": _img()}}), "obs['front']", "got str"),
        (pack({"obs": [_frame(), _frame()]}), "obs", "expected one frame"),
        (pack({"reset": True, "prompt": 3}), "prompt", "expected a string"),
        # a review: an array flag was numpy's "truth value ... is ambiguous", answered as a server error
        (pack({"reset": np.array([1, 1])}), "reset", "expected true or false, got ndarray"),
        (pack({"compute_kv_cache": np.zeros(2)}), "compute_kv_cache", "expected true or false"),
        (pack({"reset": "yes"}), "reset", "expected true or false, got str 'yes'"),
        (pack({"compute_kv_cache": True, "obs": [_frame()]}), "state", "executed actions"),
        (pack({"compute_kv_cache": True, "state": np.zeros((8, 4, 2))}), "obs", "executed frames"),
        (
            pack({"compute_kv_cache": True, "obs": [{"front": 1}], "state": np.zeros(3)}),
            "obs[0]['front']",
            "uint8",
        ),
    ],
)
def test_each_bad_request_names_its_field(message, field, expected):
    with pytest.raises(ProtocolError, match=re.escape(expected)) as info:
        decode_request(message, SPEC)
    assert info.value.field == field and str(info.value).startswith(f"{field}: ")


LIBERO = ("observation.images.agentview_rgb", "observation.images.eye_in_hand_rgb")
ALIASED = Spec(("front", "wrist"), 8, 4, 2, aliases=((LIBERO[0], "front"), (LIBERO[1], "wrist")))


def test_camera_aliases_map_a_clients_keys_to_the_runs_cameras():
    """bin/serve --camera: LIBERO's client keys name the run's cameras; the state and task keys the
    clients add to every frame are ignored; the Frame is keyed by the run's cameras."""
    sent = {LIBERO[1]: _img(20, 20), LIBERO[0]: _img(), "observation.state": np.zeros(8), "task": "t"}
    obs = decode_request(pack({"obs": sent}), ALIASED)
    assert isinstance(obs, Observe) and obs.frame is not None and set(obs.frame) == {"front", "wrist"}
    assert np.array_equal(obs.frame["wrist"], _img(20, 20)) and ALIASED.client_cameras == LIBERO
    both = r"the client keys \['observation.images.agentview_rgb'.*run's cameras \['front', 'wrist'\]"
    for frame, field in (
        ({LIBERO[0]: _img()}, f"obs[{LIBERO[1]!r}]"),  # missing
        ({**sent, "front": _img()}, "obs['front']"),  # a run camera's own name is not a client key
    ):
        with pytest.raises(ProtocolError, match=both) as info:
            decode_request(pack({"obs": frame}), ALIASED)
        assert info.value.field == field


@pytest.mark.parametrize(
    ("items", "expected"),
    [
        (["front"], "expected CLIENT_KEY=RUN_CAMERA"),
        (["=front"], "expected CLIENT_KEY=RUN_CAMERA"),
        (["a=rear", "b=wrist"], "'rear' is not one of the run's cameras \\['front', 'wrist'\\]"),
        (["a=front"], "no client key for the run's camera\\(s\\) \\['wrist'\\]"),
        (["a=front", "a=wrist"], "client key 'a' is mapped twice"),
        (["a=front", "b=front", "c=wrist"], "run camera 'front' is mapped twice"),
    ],
)
def test_bad_camera_aliases_say_what_is_wrong(items, expected):
    with pytest.raises(ValueError, match=expected):
        parse_aliases(items, ("front", "wrist"))
    assert parse_aliases([], ("front", "wrist")) == ()
    assert parse_aliases(["k2=wrist", "k1=front"], ("front", "wrist")) == (("k2", "wrist"), ("k1", "front"))


def test_a_text_frame_and_a_malformed_array_entry_are_refused():
    with pytest.raises(ProtocolError, match="text frame"):
        decode_request("hello", SPEC)
    broken = msgpack.packb({"obs": {b"__ndarray__": True, b"data": b"abc", b"dtype": "<f4", b"shape": [2]}})
    with pytest.raises(ProtocolError, match="malformed numpy array"):
        decode_request(broken, SPEC)


def test_state_shape_and_values_are_checked_against_the_chunk():
    good = np.ones((8, 3, 2), np.float64)
    assert check_state(good, SPEC, 3).dtype == np.float32
    with pytest.raises(ProtocolError, match=r"expected shape \(8, 4, 2\).*got \(8, 3, 2\)"):
        check_state(good, SPEC, 4)
    with pytest.raises(ProtocolError, match="finite"):
        check_state(np.full((8, 3, 2), np.nan), SPEC, 3)
    with pytest.raises(ProtocolError, match="numeric array"):
        check_state(np.array([["a"]]), SPEC, 3)


def test_action_layout_is_channels_frames_steps_and_inverts():
    rows = np.arange(4 * 2 * 8, dtype=np.float32).reshape(8, 8)  # [F*N, C] with F=4, N=2
    layout = action_layout(rows, 4, 2)
    assert layout.shape == (8, 4, 2)
    assert np.array_equal(layout[:, 1, 0], rows[2])  # frame 1, step 0 = row 1*N + 0, every channel
    assert np.array_equal(state_rows(layout), rows)


def test_a_dcp_checkpoint_loads_without_a_library_warning(tmp_path):
    """Issue 30: DCP's 'torch.distributed is disabled ...' UserWarning is the single-process load's intent;
    load_model silences exactly that one, so bin/evaluate and bin/serve print no library warning."""
    import torch.distributed.checkpoint as dcp

    from trainer.model import WorldModel
    from trainer.sampling.load import load_model

    torch.manual_seed(0)
    model = WorldModel(tiny_cfg()).eval()
    ckpt = tmp_path / "checkpoints" / "checkpoint_step_1"
    ckpt.mkdir(parents=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"train": {"model": model.state_dict()}}, checkpoint_id=str(ckpt), no_dist=True)
    (ckpt / "train_state.json").write_text(json.dumps({"step": 1, "config": model.cfg.to_dict()}))
    files = {p.name: p.stat().st_size for p in ckpt.iterdir()}
    (ckpt / "COMPLETE").write_text(json.dumps({"step": 1, "files": files}))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        load_model(tmp_path, None)
    assert [str(w.message) for w in caught] == []
