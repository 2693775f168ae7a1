"""Where the encoders' files are: the folder rules of the Wan2.2 VAE (data.vae_path) and the T5 text encoder
(data.text_encoder, data.tokenizer), without torch.

    vae_folder(path)                       -> the folder holding the VAE's config.json
    text_folders(text_encoder, tokenizer)  -> (the T5 encoder's folder, the tokenizer's folder)

Each accepts the released model's root as well as the sub-folder itself, and raises EncoderError naming the
setting, the file it looked for and the fix. Owned here so that bin/train's launcher (trainer/launcher/
inputs.py) judges the settings before any rank starts without importing torch (a 2-CPU-s import per launch);
the encoders (encoder.py, text.py) resolve their folders through the same functions.
"""

from __future__ import annotations

from pathlib import Path


class EncoderError(ValueError):
    """An encoder that cannot be built (missing folder, wrong sizes); names the folder/key and the fix."""


def vae_folder(path: str) -> Path:
    folder = Path(path).expanduser()
    if (folder / "vae" / "config.json").is_file():
        folder = folder / "vae"  # the released model's root was given
    if not (folder / "config.json").is_file():
        raise EncoderError(
            f"data.vae_path={path!r}: no {folder / 'config.json'}; point it at the Wan2.2 VAE folder "
            "(the released model's vae/, holding config.json and diffusion_pytorch_model.safetensors)"
        )
    return folder


def text_folders(text_encoder: str, tokenizer: str) -> tuple[Path, Path]:
    enc = Path(text_encoder).expanduser()
    if (enc / "text_encoder" / "config.json").is_file():
        root, enc = enc, enc / "text_encoder"
        tok = Path(tokenizer).expanduser() if tokenizer else root / "tokenizer"
    else:
        tok = Path(tokenizer).expanduser() if tokenizer else enc.parent / "tokenizer"
        if not tokenizer and not tok.is_dir():
            tok = enc  # a folder holding both
    if not (enc / "config.json").is_file():
        raise EncoderError(
            f"data.text_encoder={text_encoder!r}: no {enc / 'config.json'}; "
            "point it at the T5 encoder folder "
            "(the released model's text_encoder/, or the model root holding text_encoder/ and tokenizer/)"
        )
    if not any(
        (tok / name).is_file() for name in ("tokenizer.json", "spiece.model", "tokenizer_config.json")
    ):
        raise EncoderError(
            f"data.tokenizer: no tokenizer files in {tok} (tokenizer.json / spiece.model); "
            "set data.tokenizer "
            "to the released model's tokenizer/ folder"
        )
    return enc, tok
