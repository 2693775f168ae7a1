"""Sampling actions from a checkpoint: the flow-matching schedule (scheduler.py), the chunk-by-chunk sampler
with its KV cache of the history (sampler.py; the cached forward is trainer/model/streaming.py), what a
TARGET loads as a plain model and run config (load.py), and a run's data as the sampler needs it
(rundata.py). Used alike by open-loop evaluation (trainer/evaluation/) and serving (trainer/serving/).
"""
