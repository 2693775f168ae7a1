"""Dataset formats: where a dataset format is added. Each reads (and where the project records data, writes)
one on-disk layout into episodes: FurnitureBench's .pkl (furniturebench.py, the generated CPU-scale set
generate.py), LeRobot v2.x/v3.0 (lerobot.py, lerobot_v3.py, video decode video.py), the reference's latent
layout (upstream.py); which one a data.path holds (sources.py, discovery.py) and several LeRobot roots in
one run (multiroot.py). Nothing here imports torch.
"""
