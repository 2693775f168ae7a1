"""Streamed equals trained (issue 36, point 2): the latents an episode's frames get when they arrive as
upstream's clients send them (the first observation alone, then four key frames per latent frame, request
by request) equal the latents data preparation makes from the whole video (trainer/data/encoding/encoder.py
`encode`: diffusers' AutoencoderKLWan.encode, the first frame alone then groups of four), and equal
upstream's own streamed algorithm (tests/support/reference_vae_stream.py: all of a request's frames in one
encoder call with the episode's feature cache). With the tiny random-weight Wan2.2 VAE in fp32, within 1e-5;
the stand-in exactly. Also: a wrong count or a push that fails part way leaves the stream as it was."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.support.reference_vae_stream import UpstreamStream, encode_obs
from tests.support.tiny_wan import make_tiny_vae
from trainer.data.encoding.encoder import PatchMeanEncoder, StreamError, WanVAEEncoder
from trainer.data.encoding.views import compose

pytestmark = pytest.mark.fast
TOL = 1e-5
F = 3  # latent frames per chunk


@pytest.fixture(scope="module")
def vae_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("wan") / "vae"
    make_tiny_vae(folder)
    return folder


def _episode(frames: int, h: int, w: int, seed: int = 0) -> np.ndarray:
    """A moving pattern plus noise, (T, H, W, 3) uint8: frames that differ, as a robot's camera does."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    out = []
    for t in range(frames):
        base = 127 + 90 * np.sin((x + 3 * t) / 7.0)[..., None] * np.cos((y - 2 * t) / 5.0)[..., None]
        out.append(np.clip(base + rng.normal(0, 20, (h, w, 3)), 0, 255).astype(np.uint8))
    return np.stack(out)


def _client_pushes(t: int, chunks: int) -> list[int]:
    """Frames per request as upstream's clients send them: the first observation, then t key frames per
    executed latent frame: F - 1 after the first chunk, F after the others."""
    return [1, t * (F - 1)] + [t * F] * (chunks - 1)


def _streamed(enc, frames: np.ndarray, pushes: list[int]) -> np.ndarray:
    stream, out, at = enc.stream(), [], 0
    for n in pushes:
        out.append(stream.push(frames[at : at + n]))
        at += n
    return np.concatenate(out)


def test_the_wan_vae_streamed_as_clients_send_equals_the_whole_video_and_upstreams_stream(vae_dir):
    from diffusers import AutoencoderKLWan

    enc = WanVAEEncoder(str(vae_dir), latent_side=2, device=torch.device("cpu"), width=3)
    assert enc.temporal == 4 and enc.dtype == torch.float32
    pushes = _client_pushes(enc.temporal, chunks=3)
    frames = _episode(sum(pushes), 40, 56)
    whole = enc.encode(frames)  # data preparation's latents
    assert whole.shape == (1 + 2 + 3 + 3, 4, 2, 3)
    streamed = _streamed(enc, frames, pushes)
    np.testing.assert_allclose(streamed, whole, rtol=0, atol=TOL)

    vae = AutoencoderKLWan.from_pretrained(str(vae_dir), torch_dtype=torch.float32).eval()
    ref, out, at = UpstreamStream(vae), [], 0
    for n in pushes:
        images = [{"cam": f} for f in frames[at : at + n]]
        out.append(encode_obs([ref], images, ["cam"], (2 * 16, 3 * 16)))
        at += n
    np.testing.assert_allclose(streamed, np.concatenate(out), rtol=0, atol=TOL)
    assert float(np.abs(whole[1:] - whole[:-1]).max()) > 100 * TOL  # the frames differ: not a trivial match


def test_the_tshape_streamed_equals_the_whole_videos_composed_and_upstreams_tshape(vae_dir):
    from diffusers import AutoencoderKLWan

    high = WanVAEEncoder(str(vae_dir), latent_side=2, device=torch.device("cpu"), width=4)
    wrist = high.resized(1, 2)
    assert wrist._model() is high._model()  # one VAE, loaded once
    pushes = _client_pushes(4, chunks=2)
    cams = ["cam_high", "cam_left_wrist", "cam_right_wrist"]
    videos = {c: _episode(sum(pushes), 48, 64, seed=i) for i, c in enumerate(cams)}
    encoders = [high, wrist, wrist]
    whole = compose([e.encode(videos[c]) for e, c in zip(encoders, cams, strict=True)], "tshape")
    streamed = compose(
        [_streamed(e, videos[c], pushes) for e, c in zip(encoders, cams, strict=True)], "tshape"
    )
    assert whole.shape == (1 + 2 + 3, 4, 3, 4)
    np.testing.assert_allclose(streamed, whole, rtol=0, atol=TOL)

    vae = AutoencoderKLWan.from_pretrained(str(vae_dir), torch_dtype=torch.float32).eval()
    streams, out, at = [UpstreamStream(vae), UpstreamStream(vae)], [], 0
    for n in pushes:
        images = [{c: videos[c][k] for c in cams} for k in range(at, at + n)]
        out.append(encode_obs(streams, images, cams, (2 * 16, 4 * 16), tshape=True))
        at += n
    np.testing.assert_allclose(streamed, np.concatenate(out), rtol=0, atol=TOL)


def test_the_stand_in_streamed_equals_its_whole_video():
    enc = PatchMeanEncoder(16, 3, temporal=4, width=5)
    pushes = _client_pushes(4, chunks=3)
    frames = _episode(sum(pushes), 30, 50)
    np.testing.assert_array_equal(_streamed(enc, frames, pushes), enc.encode(frames))


@pytest.mark.parametrize("make", ["stand_in", "wan_vae"])
def test_a_wrong_count_or_a_failed_push_leaves_the_stream_as_it_was(vae_dir, make, monkeypatch):
    enc = (
        PatchMeanEncoder(16, 2, temporal=4)
        if make == "stand_in"
        else WanVAEEncoder(str(vae_dir), latent_side=2, device=torch.device("cpu"))
    )
    frames = _episode(13, 32, 32)
    expected = _streamed(enc, frames, [1, 4, 8])
    stream = enc.stream()
    with pytest.raises(StreamError, match="first frames must be 1 \\+ 4 x k.*got 4"):
        stream.push(frames[:4])
    parts = [stream.push(frames[:1])]
    with pytest.raises(StreamError, match="groups of 4.*got 3"):
        stream.push(frames[1:4])
    assert stream.pushed == 1
    parts.append(stream.push(frames[1:5]))
    if make == "wan_vae":  # the encoder fails on its second group: the cache must not keep the first's
        calls = {"n": 0}
        real = enc._model().encoder.forward

        def failing(*args, **kwargs):
            calls["n"] += 1
            if calls["n"] == 2:
                raise RuntimeError("device lost")
            return real(*args, **kwargs)

        monkeypatch.setattr(enc._model().encoder, "forward", failing)
        with pytest.raises(RuntimeError, match="device lost"):
            stream.push(frames[5:13])
        assert stream.pushed == 5
        monkeypatch.setattr(enc._model().encoder, "forward", real)
    parts.append(stream.push(frames[5:13]))
    np.testing.assert_allclose(np.concatenate(parts), expected, rtol=0, atol=0)
