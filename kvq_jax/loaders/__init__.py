"""Checkpoint loaders: GGUF files and Hugging Face directories.

`load_checkpoint(path) -> (ModelConfig, params, TextTokenizer | None)`; the
params layout is documented in `param_layout.py`. For names such as
'smollm2-135m' and a converted-parameter cache see `kvq_jax.assets`.
"""

from __future__ import annotations

import json
import os
import pathlib
from typing import Any

from kvq_jax.loaders import gguf as gguf_loader
from kvq_jax.loaders import hf as hf_loader
from kvq_jax.loaders import tokenizer as tokenizer_lib
from kvq_jax.loaders.gguf import load_gguf
from kvq_jax.loaders.hf import load_hf
from kvq_jax.loaders.tokenizer import TextTokenizer
from kvq_jax.loaders.tokenizer import load_gguf_tokenizer
from kvq_jax.loaders.tokenizer import load_hf_tokenizer
from kvq_jax.models.config import ModelConfig

__all__ = ["load_checkpoint", "load_config", "load_gguf", "load_hf", "load_gguf_tokenizer",
           "load_hf_tokenizer", "TextTokenizer"]


def load_checkpoint(
    path: str | os.PathLike[str],
) -> tuple[ModelConfig, dict[str, Any], TextTokenizer | None]:
  """Loads a .gguf file or a Hugging Face dir (config.json + safetensors).

  The tokenizer is None only for a Hugging Face dir without tokenizer.json.
  """
  path = pathlib.Path(path)
  if path.is_file() and path.suffix.lower() == ".gguf":
    reader = gguf_loader.open_gguf(path)
    config, params = gguf_loader.params_from_reader(reader, str(path))
    return config, params, tokenizer_lib.tokenizer_from_reader(reader, str(path))
  if path.is_dir() and (path / "config.json").is_file():
    config, params = hf_loader.load_hf(path)
    tokenizer = (load_hf_tokenizer(path)
                 if (path / "tokenizer.json").is_file() else None)
    return config, params, tokenizer
  raise ValueError(
      f"checkpoint path={str(path)!r}: expected an existing .gguf file or a "
      "directory containing config.json (Hugging Face format).")


def load_config(path: str | os.PathLike[str]) -> ModelConfig:
  """The ModelConfig of a .gguf file or Hugging Face dir, reading no weights."""
  path = pathlib.Path(path)
  if path.is_file() and path.suffix.lower() == ".gguf":
    return gguf_loader.config_from_reader(gguf_loader.open_gguf(path),
                                          str(path))
  if path.is_dir() and (path / "config.json").is_file():
    return hf_loader.config_from_hf(
        json.loads((path / "config.json").read_text()),
        repr(str(path / "config.json")))
  raise ValueError(
      f"checkpoint path={str(path)!r}: expected an existing .gguf file or a "
      "directory containing config.json (Hugging Face format).")
