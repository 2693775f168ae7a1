"""The LIBERO scene as every user of the simulator sees it: cameras, settling, the observation's orientation.

    seed_scene(seed, suite, task, episode)  # the global RNGs a scene build draws from, seeded
    seed_scene(seed, suite, task, 0, tag="demo")  # another seed space: the demonstrations' (sim/demos.py)
    obs = extract(raw)                      # the two cameras keyed as upstream's client keys them, flipped

Runs inside the simulator environment (.sim/libero); imports numpy only. The one owner of what the
evaluation's worker (trainer/evaluation/sim/worker.py), the demonstration recorder
(trainer/data/formats/libero_record.py) and the experts (experts.py) agree on: upstream 58c2ae5
evaluation/libero/client.py run_one's 128 x 128 cameras, its 5 settling steps of the zero action, and its
`_extract_obs` (both images flipped vertically, `[::-1]`). A dataset recorded through `extract` is seen by
training exactly as the evaluation's worker shows it to the served policy.

Why seed: LIBERO's `env.reset()` re-samples fixture poses (cabinet, stove) from numpy's global RNG, and
`set_init_state` restores only time, qpos and qvel; a scene is replayed bit for bit only when the RNGs were
seeded the same way before the build and the reset. A `tag` makes a seed space of its own, disjoint from
the untagged one the evaluation draws from (its strings and seed keys differ): the demonstrations are
recorded from tagged seeds, never from an evaluation's scene.
"""

from __future__ import annotations

import numpy as np

CAMERAS = ("observation.images.agentview_rgb", "observation.images.eye_in_hand_rgb")
SIZE = 128  # run_one: camera_heights, camera_widths
SETTLE = 5  # init_single_env: `for _ in range(5): env.step([0.] * 7)`


def extract(obs: dict) -> dict[str, np.ndarray]:
    """run_one's _extract_obs: both cameras flipped vertically, contiguous."""
    return {
        CAMERAS[0]: np.ascontiguousarray(obs["agentview_image"][::-1]),
        CAMERAS[1]: np.ascontiguousarray(obs["robot0_eye_in_hand_image"][::-1]),
    }


def seed_scene(seed: int, suite: str, task: int, episode: int, tag: str = "") -> None:
    """The global RNGs LIBERO and robosuite draw from while building a scene (see the module docstring)."""
    import random
    import zlib

    random.seed(f"{seed}:{suite}:{task}:{episode}" + (f":{tag}" if tag else ""))
    key = [seed, task, episode, sum(suite.encode())]
    np.random.seed(key + [zlib.crc32(tag.encode())] if tag else key)
