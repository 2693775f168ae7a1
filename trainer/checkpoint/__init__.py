"""Checkpoints of a run: how they are written and read, what is on disk, how big they get, which one is
best, and whether the disk has room.

    checkpointer.py  DCP save/load (Checkpointer), the scan that finds complete checkpoints, resume
    layout.py        the on-disk layout: complete / partial / damaged, the marker, CheckpointInfo
    size.py          the size estimate of one checkpoint (the preflight's disk check, the stall limit)
    best.py          the best checkpoint by a held-out metric and the `checkpoints/best` pointer
    diskspace.py     out of space: the guard around every write, the free-space check
    finite.py        no checkpoint carries NaN/Inf: the check before a save, the check before a resume

Import the module you need (`from trainer.checkpoint.checkpointer import Checkpointer`): this package
re-exports nothing, so importing one of them never runs the others.
"""
