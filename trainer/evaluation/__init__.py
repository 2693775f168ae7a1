"""Scoring a checkpoint. Open loop: predicted vs recorded actions on held-out demonstrations (openloop.py,
its pictures plots.py, bin/evaluate's command cli.py). Closed loop: upstream's LIBERO and RoboTwin client
loops (loops.py) driving a served policy, against the replay environment (replay.py) or a simulator.
"""
