"""Action inference and open-loop evaluation: the sampling schedule (scheduler.py), the chunk-by-chunk
sampler with its KV cache of the history (sampler.py; the cached forward is trainer/model/streaming.py),
and the held-out open-loop evaluation with its command (evaluate.py, cli.py).
"""
