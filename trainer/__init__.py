"""trainer: the launcher side (trainer/launcher/, tool env: processes, signals, the verdict) and the rank
side (train.py, rank.py, model/, data/: provisioned env, the model and the loop); see README "Architecture".
"""
