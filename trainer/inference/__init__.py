"""Action inference and evaluation: the sampling schedule (scheduler.py), the chunk-by-chunk sampler with
its KV cache of the history (sampler.py; the cached forward is trainer/model/streaming.py), the held-out
open-loop evaluation with its command and pictures (evaluate.py, cli.py, plots.py), and the closed loop:
bin/serve's protocol, sessions, server and command (protocol.py, session.py, server.py, serve_cli.py) and
the replay environment that drives it without a simulator (replay.py).
"""
