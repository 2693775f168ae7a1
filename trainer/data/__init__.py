"""Data path: dataset files -> latents (cached) -> deterministic micro-batches.

    formats/    where a dataset format is added: FurnitureBench .pkl, LeRobot v2.x/v3.0, the reference's
                latent layout, which one a data.path holds (no torch)
    encoding/   frames and prompts -> latents and embeddings; the cameras' latent grid (views.py)
    cache/      the latent cache, its preparation and its lock
    stream.py   the training batch stream (prefetch.py: its background thread); split.py the held-out
                episodes; short.py episodes too short for a clip; normalize.py; poses.py relative poses

This package imports nothing: import the module that owns a name (`from trainer.data.stream import
build_stream`), so that reading one small rule (encoding/views.py) never runs the stream's imports.
"""
