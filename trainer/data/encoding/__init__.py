"""Encoding: frames -> latents (encoder.py: the Wan2.2 VAE or the stand-in, whole videos and streamed
episodes), prompts -> embeddings (text.py), where the encoders' files are (folders.py: their folder rules,
torch-free for the launcher's preflight), how the cameras compose one latent grid (views.py, the one owner
of data.layout, read by the model's mask too), and which rows each camera's encoder sees (rows.py).
"""
