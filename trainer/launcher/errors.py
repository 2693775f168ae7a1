"""Exceptions shared by the launcher's modules (no other state)."""

from __future__ import annotations


class PreflightError(Exception):
    """A reason not to start any rank; the message says what is wrong and how to fix it."""


class StopBeforeStart(Exception):
    """A stop signal arrived before torchrun started: nothing was trained."""
