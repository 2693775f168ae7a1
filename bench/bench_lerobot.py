"""LeRobot datasets on CPU: video decode frames/s (PyAV, AV1 as lerobot writes it) and the whole
preparation path (parquet + decode + encode + cache entry) frames/s, patch_mean and a tiny AutoencoderKLWan.

    .venv/bin/python bench/bench_lerobot.py [--quick] [--lerobot 0.4.4]

The dataset is written by lerobot itself, 0.3.3 (v2.1 layout, the default) or 0.4.4 (v3.0: every episode
in one data file and one video file per camera, read by seeking to each episode's from_timestamp)
(tests/support/lerobot_env.py, its cached test-only environments, run as a program; the first run builds
one): 2 video cameras at 224 x 224 (libsvtav1, yuv420p, g=2, crf=30: its defaults), one image camera (not
read here), 10 fps. Writing is not timed.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_prepare import TINY_VAE  # noqa: E402
from bench.common import REPO, Table, fixture_program  # noqa: E402

CAMERAS = ("observation.images.front", "observation.images.wrist")


def write_dataset(root: Path, episodes: int, length: int, version: str) -> None:
    """lerobot itself writes the dataset: the tests' writer env and script (tests/support/lerobot_env.py,
    lerobot_write.py), run as a program (bench/ imports nothing of tests/)."""
    script = REPO / "tests" / "support" / "lerobot_write.py"
    args = [str(root), "--episodes", str(episodes), "--length", str(length), "--size", "224"]
    fixture_program(
        "from pathlib import Path\n"
        "from tests.support.lerobot_env import lerobot_site, run_writer\n"
        f"run_writer(Path({str(script)!r}), {args!r}, lerobot_site(version={version!r}), timeout=1800)\n",
        timeout=3600,
    )


def lerobot_layout(root: Path) -> str:
    from trainer.data.formats import lerobot

    return lerobot.load(root).version


def decode_rate(root: Path) -> tuple[float, int, float]:
    from trainer.data.formats import lerobot

    ds = lerobot.load(root)
    frames, t0 = 0, time.perf_counter()
    for parquet in ds.files():
        ep = lerobot.read_episode(ds, parquet, list(CAMERAS), [])
        frames += sum(int(x.shape[0]) for x in ep.images.values())
    seconds = time.perf_counter() - t0
    return frames / seconds, frames, seconds


def prepare_rate(root: Path, encoder: str, tmp: Path) -> tuple[float, int, float]:
    import torch
    from diffusers import AutoencoderKLWan

    from trainer.config import load_config
    from trainer.data.cache.prepare import prepare

    overrides = {
        "data.path": str(root), "data.cameras": list(CAMERAS), "data.text_length": 16, "data.val_episodes": 0,
        "model.latent_channels": 4, "model.latent_size": 8, "model.action_used": 7,
        "data.cache_dir": str(tmp / f"cache-{encoder}"),
    }  # fmt: skip
    if encoder == "wan_vae":
        torch.manual_seed(0)
        AutoencoderKLWan(**TINY_VAE).save_pretrained(tmp / "vae")  # type: ignore[attr-defined]
        overrides.update({"data.encoder": "wan_vae", "data.vae_path": str(tmp / "vae")})
        overrides["data.actions_per_frame"] = 4
    cfg = load_config("furniture_train", True, overrides)
    t0 = time.perf_counter()
    done = prepare(cfg, log=lambda line: None)
    seconds = time.perf_counter() - t0
    return done.frames / seconds, done.frames, seconds


def run(quick: bool, version: str = "0.3.3") -> list[Table]:
    episodes, length = (4, 40) if quick else (8, 80)
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        root = tmp / "ds"
        write_dataset(root, episodes, length, version)
        layout = lerobot_layout(root)
        dec = decode_rate(root)
        rows = [["decode only (PyAV, AV1 -> RGB)", dec[1], dec[2], dec[0]]]
        for name in ("patch_mean", "wan_vae"):
            rate, frames, seconds = prepare_rate(root, name, tmp)
            label = "prepare, " + (name if name == "patch_mean" else "wan_vae (tiny random AutoencoderKLWan)")
            rows.append([label, frames, seconds, rate])
    return [
        Table(
            f"LeRobot {layout} dataset on CPU (written by lerobot {version}; 2 video cameras, 224x224, AV1)",
            ["path", "frames", "seconds", "frames/s"],
            rows,
            ratio=f"decode {rows[0][3]:.0f} frames/s; prepare with the tiny VAE {rows[2][3]:.1f} frames/s",
            notes=[
                f"{episodes} episodes x {length}+e frames x 2 cameras (episode e has {length}+e frames); "
                "prepare = parquet + decode + encode + cache entry + manifest; tiny VAE at 128 px"
            ],
        )
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--lerobot", default="0.3.3", choices=("0.3.3", "0.4.4"), help="the writer's release")
    args = parser.parse_args()
    for table in run(args.quick, args.lerobot):
        print(table.markdown())
    return 0


if __name__ == "__main__":
    sys.exit(main())
