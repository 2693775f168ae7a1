"""The scripted motion that records the CPU scale's LIBERO dataset (trainer/data/formats/libero_record.py):
pure arithmetic, no simulator. The recording itself needs lerobot in the simulator env (not in its lock
yet), so it is not run here."""

from __future__ import annotations

import numpy as np
import pytest

from trainer.data.formats.libero_record import OUTPUT_MAX, phase_of, scripted_action

pytestmark = pytest.mark.fast


def test_phases_reach_then_descend_grasp_and_lift_in_order():
    phases = [phase_of(t, 40) for t in range(40)]
    order = [p for i, p in enumerate(phases) if i == 0 or phases[i - 1] != p]
    assert order == ["approach", "descend", "grasp", "lift"]
    assert phases.count("approach") == 18 and phases[-1] == "lift"


def test_actions_head_for_the_object_and_close_the_gripper():
    eef, obj = np.array([0.0, 0.0, 1.2]), np.array([0.01, -0.2, 0.9])
    approach = scripted_action(eef, obj, "approach")
    assert approach.shape == (7,) and approach.dtype == np.float32
    assert approach[0] == pytest.approx(0.01 / OUTPUT_MAX) and approach[1] == -1.0  # clipped to [-1, 1]
    assert approach[2] == -1.0 and approach[6] == -1.0 and not approach[3:6].any()  # open, no rotation
    above = np.array([0.01, -0.2, 0.92])
    assert np.allclose(scripted_action(above, obj, "descend")[:3], 0.0)  # 2 cm above: there
    assert list(scripted_action(above, obj, "grasp")) == [0, 0, 0, 0, 0, 0, 1.0]
    assert list(scripted_action(above, obj, "lift")) == [0, 0, 1.0, 0, 0, 0, 1.0]
