"""LIBERO's suites and what a served run must be to drive them: checked before any simulator is built.

    n = task_count("libero_10")             # 10: the suite's bddl files in sim/libero/bddl-8f1084e.txt
    tasks = parse_tasks("0-2,5", n)         # [0, 1, 2, 5]; None (all) -> range(n)
    check_served(spec)                      # UsageError unless LIBERO's client loop can drive it

Every refusal is one line naming the option or the run's key and the fix (UsageError; the command exits
2). What LIBERO's client loop needs of the served run (upstream evaluation/libero/client.py run_one):
- 7 action channels: each action `action[:, i, j]` goes to `env.step`, LIBERO's OSC_POSE controller on a
  Panda with its gripper (xyz delta, axis-angle delta, gripper): model.action_used / data.action_slots;
- N (actions per latent frame, data.actions_per_frame) a multiple of 4: the client asserts it;
- the images keyed as the client keys them (`observation.images.agentview_rgb`, `..eye_in_hand_rgb`):
  the run's cameras (the `libero` preset's), or mapped with --camera CLIENT_KEY=RUN_CAMERA.
"""

from __future__ import annotations

from pathlib import Path

SUITES = ("libero_10", "libero_spatial", "libero_object", "libero_goal")
CHANNELS = 7
CAMERAS = ("observation.images.agentview_rgb", "observation.images.eye_in_hand_rgb")
MANIFEST = Path(__file__).resolve().parents[2] / "sim" / "libero" / "bddl-8f1084e.txt"


class UsageError(ValueError):
    """Bad input: one line naming the option or key and the fix (exit 2)."""


def check_suite(suite: str) -> str:
    if suite not in SUITES:
        raise UsageError(f"--suite {suite!r}: unknown LIBERO suite; one of {', '.join(SUITES)}")
    return suite


def task_count(suite: str) -> int:
    """The suite's tasks: its bddl files in upstream LIBERO 8f1084e (the committed manifest)."""
    check_suite(suite)
    lines = MANIFEST.read_text().splitlines()
    return sum(1 for line in lines if line.split()[-1].startswith(f"{suite}/") and line.endswith(".bddl"))


def parse_tasks(text: str | None, n: int, suite: str = "") -> list[int]:
    """'0-2,5' -> [0, 1, 2, 5] (ranges inclusive, in the order given, each task once); None/'all' -> all."""
    if text is None or text.strip() in ("", "all"):
        return list(range(n))
    out: list[int] = []
    for part in text.split(","):
        a, dash, b = part.strip().partition("-")
        try:
            lo, hi = int(a), int(b) if dash else int(a)
        except ValueError:
            raise UsageError(f"--tasks {text!r}: expected task numbers and ranges, e.g. 0-2,5") from None
        if lo > hi or lo < 0 or hi >= n:
            raise UsageError(f"--tasks {text!r}: {part.strip()} is out of range; {suite} has tasks 0-{n - 1}")
        out += [t for t in range(lo, hi + 1) if t not in out]
    return out


def check_counts(episodes: int, max_steps: int, workers: int) -> None:
    for name, value in (("--episodes", episodes), ("--max-steps", max_steps), ("--workers", workers)):
        if value < 1:
            raise UsageError(f"{name} {value}: expected at least 1")


def check_served(spec, run: str) -> None:
    """UsageError unless LIBERO's loop can drive this run (spec: protocol.Spec with its aliases)."""
    if spec.channels != CHANNELS:
        raise UsageError(
            f"{run}: the run serves {spec.channels} action channels (model.action_used / data.action_slots); "
            f"LIBERO's controller takes {CHANNELS} (xyz, axis-angle, gripper): evaluate a libero preset run"
        )
    if spec.actions_per_frame % 4:
        raise UsageError(
            f"{run}: N = {spec.actions_per_frame} actions per latent frame (data.actions_per_frame) is not a "
            "multiple of 4, which LIBERO's client asserts; train with data.actions_per_frame 4 (the preset's)"
        )
    if set(spec.client_cameras) != set(CAMERAS):
        raise UsageError(
            f"{run}: the run's cameras {list(spec.client_cameras)} are not LIBERO's client keys "
            f"{list(CAMERAS)}; "
            "map them with --camera CLIENT_KEY=RUN_CAMERA (one per camera)"
        )
