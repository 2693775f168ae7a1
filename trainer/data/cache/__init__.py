"""The latent cache: every used episode encoded once, next to the data, with a manifest that proves it
(store.py; LeRobot's entries lerobot_entries.py), prepared offline or on first use (prepare.py), at the
location a config names, under the lock that serialises writing there (location.py).
"""
