"""Closed-loop evaluation in a real simulator: LIBERO (bin/evaluate TARGET --sim libero).

command.py  the command: checks, the in-process server, the episodes, the results
runner.py   K simulator worker processes; a crash is its episode's error
worker.py   upstream's client loop (evaluation/libero/client.py run_one), in the simulator env
report.py   results.json, success.png, the progress bar

The simulator itself (its env, scene, suites, experts) is trainer/sim/.
"""
