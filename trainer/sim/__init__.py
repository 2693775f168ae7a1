"""The LIBERO simulator, one package for everything that runs it: recording data and scoring policies.

env.py      the simulator env (.sim/libero, built by sim/build.sh) and its GL backend
assets.py   the installed LIBERO files checked against upstream's blob hashes (sim/build.sh)
suites.py   LIBERO's suites, --tasks, what a served run must be for LIBERO's loop
scene.py    cameras, settling, the observation's orientation, the scene's seeding
goal.py     a task put into its goal state through LIBERO's state API (the tests' proof that success counts)
demos.py    expert demonstrations from seeded random resets (never the official init states), replayed bit
            for bit from their seed (the recorder's and the evaluation worker's demo_seed jobs)

Evaluation (trainer/evaluation/sim/) keeps the scoring and the report; data recording
(trainer/data/formats/libero_record.py) keeps the dataset writer. Modules that run inside the simulator env
import nothing of the tool env's (no torch).
"""
