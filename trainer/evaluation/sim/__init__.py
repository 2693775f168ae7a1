"""Closed-loop evaluation in a real simulator: LIBERO (bin/evaluate TARGET --sim libero).

command.py  the command: checks, the in-process server, the episodes, the results
suites.py   LIBERO's suites, --tasks, what a served run must be for LIBERO's loop
env.py      the simulator env (.sim/libero, built by sim/build.sh) and its GL backend
runner.py   K simulator worker processes; a crash is its episode's error
worker.py   upstream's client loop (evaluation/libero/client.py run_one), in the simulator env
goal.py     a task put into its goal state through LIBERO's state API (the tests' proof that success counts)
report.py   results.json, success.png, the progress bar
assets.py   the installed LIBERO files checked against upstream's blob hashes (sim/build.sh)
"""
