"""Exceptions shared by the launcher's modules (no other state)."""

from __future__ import annotations


class PreflightError(Exception):
    """A reason not to start any rank; the message says what is wrong and how to fix it."""


class StopBeforeStart(BaseException):
    """A stop signal arrived before torchrun started: nothing was trained.

    A BaseException, like KeyboardInterrupt: raised from a signal handler anywhere in preflight, it must
    not be caught as a failed check by code that guards against Exception (bin/envcheck's checks do)."""
