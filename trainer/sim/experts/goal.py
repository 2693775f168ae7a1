"""Scripted experts for libero_goal tasks (see __init__.py for the API, core.py for the pieces).

Each reads the scene from the simulator's own state (the fixtures' geoms and joints, the objects' bodies)
and plays phases of targets for the end effector; the measured facts each one is built on are in its
docstring.
"""

from __future__ import annotations

import numpy as np

from trainer.sim.experts.core import CLOSED, DOWN, OPEN, Script, State, Step, rot_x, rot_y, rot_z


class MiddleDrawer(Script):
    """ "open the middle drawer of the cabinet". The middle drawer's handle (a bar along x on the drawer's
    front) sits under the top drawer's handle, so a top-down grasp is blocked: the gripper is pitched about
    world x by -1.3 rad (pointing at the cabinet, fingers closing vertically), comes in horizontally, pinches
    the bar and pulls along the drawer's opening direction until the joint is open."""

    phases = ("turn", "approach", "lower", "insert", "grasp", "pull")
    cabinet = "wooden_cabinet_1"
    joint = "wooden_cabinet_1_middle_level"
    drawer = "wooden_cabinet_1_cabinet_middle"
    pitch = -1.3

    def handle(self, s: State) -> tuple[np.ndarray, np.ndarray]:
        """The handle bar's centre (the drawer's collision geom furthest along the opening direction) and
        the opening direction (the slide joint opens towards negative qpos)."""
        out = -s.joint_axis(self.joint)
        bar = max(s.geoms(self.drawer), key=lambda g: float(s.geom(g) @ out))
        return s.geom(bar), out

    def rot(self, s: State) -> np.ndarray:
        _, out = self.handle(s)
        yaw = np.arctan2(-out[0], out[1])  # the cabinet faces +y at yaw 0
        return rot_z(yaw) @ rot_x(self.pitch) @ DOWN

    def turn(self, s: State) -> Step:
        bar, out = self.handle(s)
        pos = np.array([s.pos[0], s.pos[1], max(s.pos[2], bar[2] + 0.1)])
        rot = self.rot(s)
        return Step(pos, rot, OPEN, done=self.near(s, pos, 0.03, rot, 0.15) or self.t > 30)

    def approach(self, s: State) -> Step:
        """In front of the handle, 7 cm above it: the open fingers (spread vertically) travel over the
        objects on the table (measured: at the handle's height the lower finger swept the bowl into the
        drawer's front in 18 of 37 episodes)."""
        bar, out = self.handle(s)
        pos = bar + 0.10 * out + [0, 0, 0.07]
        rot = self.rot(s)
        return Step(pos, rot, OPEN, done=self.near(s, pos, 0.02, rot, 0.1) or self.t > 40)

    def lower(self, s: State) -> Step:
        bar, out = self.handle(s)
        pos = bar + 0.10 * out
        return Step(pos, self.rot(s), OPEN, done=self.near(s, pos, 0.012) or self.t > 20)

    def insert(self, s: State) -> Step:
        bar, out = self.handle(s)
        pos = bar - 0.005 * out
        return Step(pos, self.rot(s), OPEN, done=self.near(s, pos, 0.008) or self.t > 25, speed=0.5)

    def grasp(self, s: State) -> Step:
        bar, out = self.handle(s)
        return Step(bar - 0.005 * out, self.rot(s), CLOSED, done=self.t >= 8)

    def pull(self, s: State) -> Step:
        if "start" not in self.memo:
            self.memo["start"] = s.pos.copy()
        _, out = self.handle(s)
        return Step(self.memo["start"] + 0.20 * out, self.rot(s), CLOSED, speed=0.6)


class PickPlace(Script):
    """Pick an object by pinching one spot of it from above, carry it over a target, lower it and let go.
    Subclasses say where the pinch is (`pinch`), where the object goes (`target`: the spot under the
    object's body origin) and at what height above the target the object is let go (`drop`)."""

    phases: tuple[str, ...] = ("above", "descend", "close", "lift", "carry", "lower", "release", "retreat")
    obj = ""
    drop = 0.02  # the object's origin this far above the target when the gripper opens
    carry_z = 1.08

    def pinch(self, s: State) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError

    def target(self, s: State) -> np.ndarray:
        raise NotImplementedError

    def above(self, s: State) -> Step:
        pos, rot = self.pinch(s)
        pos = pos + [0, 0, 0.08]
        return Step(pos, rot, OPEN, done=self.near(s, pos, 0.015, rot, 0.1) or self.t > 60)

    def descend(self, s: State) -> Step:
        pos, rot = self.pinch(s)
        return Step(pos, rot, OPEN, done=self.near(s, pos, 0.006) or self.t > 30, speed=0.5)

    def close(self, s: State) -> Step:
        pos, rot = self.pinch(s)
        if "grab" not in self.memo:
            self.memo["grab"] = pos
        return Step(self.memo["grab"], rot, CLOSED, done=self.t >= 8)

    def lift(self, s: State) -> Step:
        if "offset" not in self.memo:
            self.memo["offset"] = s.pos - s.obj(self.obj)  # the eef relative to the object, held from here
            self.memo["rot"] = s.rot.copy()
        pos = np.array([s.pos[0], s.pos[1], self.carry_z])
        pos[:2] = self.memo["grab"][:2]
        return Step(pos, self.memo["rot"], CLOSED, done=s.pos[2] > self.carry_z - 0.04 or self.t > 40)

    def carry(self, s: State) -> Step:
        pos = self.target(s) + self.memo["offset"]
        pos[2] = self.carry_z
        return Step(pos, self.memo["rot"], CLOSED, done=self.near(s, pos, 0.015) or self.t > 80)

    def lower(self, s: State) -> Step:
        goal = self.target(s) + [0, 0, self.drop]
        pos = goal + self.memo["offset"]
        low = s.obj(self.obj)[2] - goal[2]
        return Step(pos, self.memo["rot"], CLOSED, done=low < 0.01 or self.t > 15, speed=0.6)

    def release(self, s: State) -> Step:
        if "let" not in self.memo:
            self.memo["let"] = s.pos.copy()
        return Step(self.memo["let"], self.memo["rot"], OPEN, done=self.t >= 6)

    def retreat(self, s: State) -> Step:
        return Step(self.memo["let"] + [0, 0, 0.1], self.memo["rot"], OPEN)


class Bowl(PickPlace):
    """A bowl pinched by its rim wall: the gripper down, fingers closing along the wall's normal at the
    rim's point on the -y side (the fingers close along world y), just under the rim's top."""

    obj = "akita_black_bowl_1"
    rim = 0.045  # m from the bowl's axis to its upper wall
    depth = 0.027  # the pinch's height above the bowl's origin (0.037: over the wall, measured)

    def pinch(self, s: State) -> tuple[np.ndarray, np.ndarray]:
        return s.obj(self.obj) + [0, -self.rim, self.depth], DOWN


class BowlOnPlate(Bowl):
    """ "put the bowl on the plate"."""

    def target(self, s: State) -> np.ndarray:
        return s.obj("plate_1") + [0, 0, 0.01]


class BowlOnStove(Bowl):
    """ "put the bowl on the stove": over the burner (the stove's cook region)."""

    def target(self, s: State) -> np.ndarray:
        return s.sim.data.site_xpos[s.model.site_name2id("flat_stove_1_burner")].copy()


class Stove(Script):
    """ "turn on the stove". Pushing the knob's ridge turns it only 0.04-0.13 rad of the 0.5 needed (measured
    by the issue's author), so the ridge (the knob's tallest collision geom, a bar across its top) is
    pinched from above, fingers across the bar, centred on the knob's hinge, and the wrist twists about z
    (the hinge's axis; turning on is positive) until the joint is past LIBERO's turn-on threshold."""

    phases = ("above", "descend", "close", "twist", "hold")
    joint = "flat_stove_1_button"
    knob = "flat_stove_1_button"
    on = 0.5  # LIBERO's default_turnon_ranges[0]
    twist_by = 0.9  # rad the wrist is asked to turn past the grasp (the knob lags the soft controller)
    depth = 0.025  # the pinch's height under the ridge's top

    def ridge(self, s: State) -> tuple[np.ndarray, float]:
        """The pinch point (on the hinge's axis, under the ridge's top) and the gripper's yaw."""
        bar = max(s.geoms(self.knob), key=s.top)
        r, size = s.sim.data.geom_xmat[bar].reshape(3, 3), s.model.geom_size[bar]
        long = max(range(3), key=lambda i: size[i] * np.linalg.norm(r[:2, i]))
        yaw = float(np.arctan2(r[1, long], r[0, long]))
        yaw = (yaw + np.pi / 2) % np.pi - np.pi / 2  # the bar's direction, either way: the nearer yaw
        anchor = s.joint_anchor(self.joint)
        return np.array([anchor[0], anchor[1], s.top(bar) - self.depth]), yaw

    def grasp_rot(self, s: State) -> np.ndarray:
        if "yaw" not in self.memo:
            self.memo["pinch"], self.memo["yaw"] = self.ridge(s)
        return rot_z(self.memo["yaw"]) @ DOWN

    def above(self, s: State) -> Step:
        rot = self.grasp_rot(s)
        pos = self.memo["pinch"] + [0, 0, 0.08]
        return Step(pos, rot, OPEN, done=self.near(s, pos, 0.015, rot, 0.08) or self.t > 60)

    def descend(self, s: State) -> Step:
        pos = self.memo["pinch"]
        return Step(pos, self.grasp_rot(s), OPEN, done=self.near(s, pos, 0.006) or self.t > 30, speed=0.5)

    def close(self, s: State) -> Step:
        return Step(self.memo["pinch"], self.grasp_rot(s), CLOSED, done=self.t >= 8)

    def twist(self, s: State) -> Step:
        rot = rot_z(self.memo["yaw"] + self.twist_by) @ DOWN
        return Step(self.memo["pinch"], rot, CLOSED, done=s.joint(self.joint) > self.on + 0.1 or self.t > 80)

    def hold(self, s: State) -> Step:
        return Step(self.memo["pinch"], s.rot, CLOSED)


class PlateToStoveFront(PickPlace):
    """ "push the plate to the front of the stove". The plate is at the edge of the arm's reach and slides
    only when its rim is pinched (pushing from inside rides over the rim; measured by the issue's author):
    the rim's +y side (towards the stove, away from the bowl) is pinched from above, the gripper tilted
    forward about y, and the plate is dragged over the table to the stove-front region's centre, then let
    go."""

    phases = ("above", "descend", "close", "drag", "release", "retreat")
    obj = "plate_1"
    rim = 0.048  # m from the plate's axis to its rim
    depth = 0.012  # the pinch's height above the plate's origin
    tilt = -0.4

    def pinch(self, s: State) -> tuple[np.ndarray, np.ndarray]:
        return s.obj(self.obj) + [0, self.rim, self.depth], rot_y(self.tilt) @ DOWN

    def target(self, s: State) -> np.ndarray:
        site = s.sim.data.site_xpos[s.model.site_name2id("main_table_stove_front_region")]
        return np.array([site[0], site[1], s.obj(self.obj)[2]])

    def drag(self, s: State) -> Step:
        if "offset" not in self.memo:
            self.memo["offset"] = s.pos - s.obj(self.obj)
            self.memo["rot"] = s.rot.copy()
        pos = self.target(s) + self.memo["offset"]
        left = np.linalg.norm((self.target(s) - s.obj(self.obj))[:2])
        return Step(pos, self.memo["rot"], CLOSED, done=bool(left < 0.01) or self.t > 150, speed=0.5)
