"""Prompt -> text embedding: T5 (umt5-xxl, as LingBot-VA) from a local folder, or a loud stand-in.

    enc = make_text_encoder(cfg)
    emb, mask = enc.embed(prompt)        # (L, D) float32 zero-padded after the prompt, (L,) bool

t5          transformers' UMT5EncoderModel + the tokenizer (AutoTokenizer) from local folders
            (data.text_encoder:
            the released model's root or its text_encoder/; data.tokenizer, default the tokenizer/ beside
            it). As the reference (`_get_t5_prompt_embeds`): whitespace-cleaned prompt, padded to
            max_length L = data.text_length with the special tokens, last hidden state, rows past the
            prompt's length set to zero. bf16 on GPU, fp32 on CPU.
stand-in    no weights: token i of the prompt (lower-cased words, then </s>) gets a fixed vector drawn from a
            seed derived from the word, so equal prompts embed equally and different ones differ. Same
            shapes and padding as t5. Announced as a stand-in wherever it is used.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any, Protocol

import numpy as np
import torch

from trainer.data.encoding.encoder import default_device
from trainer.data.encoding.folders import EncoderError, text_folders


class TextEncoder(Protocol):
    name: str
    dim: int
    length: int
    stand_in: bool

    def config(self) -> dict[str, Any]: ...

    def embed(self, prompt: str) -> tuple[np.ndarray, np.ndarray]: ...


def clean_prompt(prompt: str) -> str:
    return re.sub(r"\s+", " ", prompt).strip()


class StandInText:
    name = "stand-in"
    stand_in = True

    def __init__(self, dim: int, length: int):
        self.dim, self.length = dim, length

    def config(self) -> dict[str, Any]:
        return {"name": self.name, "dim": self.dim, "length": self.length, "version": 1}

    def embed(self, prompt: str) -> tuple[np.ndarray, np.ndarray]:
        tokens = [*clean_prompt(prompt).lower().split(), "</s>"][: self.length]
        emb = np.zeros((self.length, self.dim), np.float32)
        for i, token in enumerate(tokens):
            seed = int.from_bytes(hashlib.sha256(token.encode()).digest()[:8], "little")
            emb[i] = 0.1 * np.random.default_rng(seed).standard_normal(self.dim)
        mask = np.zeros(self.length, bool)
        mask[: len(tokens)] = True
        return emb, mask


class T5Text:
    """Sizes and the cache's config come from the folders' files; the model loads on the first embed."""

    name = "t5"
    stand_in = False

    def __init__(self, text_encoder: str, tokenizer: str, length: int, device: torch.device | None = None):
        self.enc_folder, self.tok_folder = text_folders(text_encoder, tokenizer)
        self.length = length
        self.device = device or default_device()
        self.dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        try:
            self.model_config = json.loads((self.enc_folder / "config.json").read_text())
            self.dim = int(self.model_config["d_model"])
        except (ValueError, KeyError) as exc:
            raise EncoderError(
                f"{self.enc_folder / 'config.json'}: not a T5 encoder config ({exc!r})"
            ) from exc
        weights = sorted(self.enc_folder.glob("*.safetensors")) + sorted(self.enc_folder.glob("*.bin"))
        if not weights:
            raise EncoderError(f"{self.enc_folder}: no model*.safetensors beside config.json")
        self._weights = [(p.name, p.stat().st_size) for p in weights]
        digest = hashlib.sha256()
        for p in sorted(self.tok_folder.iterdir()):
            if p.is_file() and p.suffix in (".json", ".model"):
                digest.update(p.name.encode() + p.read_bytes())
        self._tokenizer_hash = digest.hexdigest()[:16]
        self._loaded: tuple[Any, Any] | None = None

    def config(self) -> dict[str, Any]:
        model_config = {k: v for k, v in self.model_config.items() if not k.startswith("_")}
        model_config.pop("transformers_version", None)
        return {
            "name": self.name,
            "model_config": model_config,
            "weights": self._weights,
            "tokenizer": self._tokenizer_hash,
            "length": self.length,
            "dtype": str(self.dtype),
        }

    def _load(self) -> tuple[Any, Any]:
        if self._loaded is None:
            from transformers import AutoTokenizer, UMT5EncoderModel  # the preparation path only

            try:
                tokenizer = AutoTokenizer.from_pretrained(str(self.tok_folder))
                model = UMT5EncoderModel.from_pretrained(str(self.enc_folder), dtype=self.dtype)
            except (OSError, ValueError, RuntimeError) as exc:
                raise EncoderError(
                    f"{self.enc_folder} / {self.tok_folder}: cannot load the T5 encoder or tokenizer "
                    f"({type(exc).__name__}: {exc})"
                ) from exc
            model.to(self.device)
            self._loaded = (tokenizer, model.eval())
        return self._loaded

    @torch.no_grad()
    def embed(self, prompt: str) -> tuple[np.ndarray, np.ndarray]:
        tokenizer, model = self._load()
        inputs = tokenizer(
            [clean_prompt(prompt)],
            padding="max_length",
            max_length=self.length,
            truncation=True,
            add_special_tokens=True,
            return_attention_mask=True,
            return_tensors="pt",
        )
        ids, mask = inputs.input_ids.to(self.device), inputs.attention_mask.to(self.device)
        hidden = model(ids, mask).last_hidden_state[0].float().cpu()
        n = int(mask.gt(0).sum())
        hidden[n:] = 0.0
        real = np.zeros(self.length, bool)
        real[:n] = True
        return np.ascontiguousarray(hidden.numpy(), dtype=np.float32), real


def make_text_encoder(cfg, device: torch.device | None = None) -> TextEncoder:
    d = cfg.data
    dim = int(getattr(cfg.model, "text_dim", 4096))
    if not d.text_encoder:
        return StandInText(dim, d.text_length)
    enc = T5Text(d.text_encoder, d.tokenizer, d.text_length, device)
    if enc.dim != dim:
        raise EncoderError(
            f"{enc.enc_folder / 'config.json'}: d_model {enc.dim} != model.text_dim {dim}; "
            f"set model.text_dim={enc.dim}"
        )
    return enc
