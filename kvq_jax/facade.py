"""The small, stable public entry points: `load_model` and `forward_logits`."""

from __future__ import annotations

import dataclasses
import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from kvq_jax import assets
from kvq_jax.cache.factory import init_cache
from kvq_jax.cache.spec import CacheSpec
from kvq_jax.loaders.tokenizer import TextTokenizer
from kvq_jax.models.config import ModelConfig
from kvq_jax.models.decoder import Decoder
from kvq_jax.models.params import decoder_from_params

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16,
           "float16": jnp.float16}


def parse_dtype(name: str, field: str = "dtype"):
  if name not in _DTYPES:
    raise ValueError(
        f"{field}={name!r}: allowed values are {', '.join(_DTYPES)}.")
  return _DTYPES[name]


@dataclasses.dataclass
class LoadedModel:
  """A decoder with its tokenizer; `.config` is the architecture."""

  decoder: Decoder
  tokenizer: TextTokenizer | None
  source: str

  @property
  def config(self) -> ModelConfig:
    return self.decoder.config

  @functools.cached_property
  def split(self):
    return nnx.split(self.decoder)


def load_model(name_or_path: str | os.PathLike = assets.DEFAULT_MODEL,
               dtype: str = "float32") -> LoadedModel:
  """Loads a named model ('smollm2-135m'), a .gguf file or an HF directory.

  The first load of a checkpoint converts it and caches the converted
  parameters (orbax) under `kvq_jax.assets.cache_root()`.
  """
  config, params, tokenizer = assets.load_params_cached(name_or_path)
  jdtype = parse_dtype(dtype)
  decoder = decoder_from_params(config, params, dtype=jdtype,
                                param_dtype=jdtype)
  return LoadedModel(decoder=decoder, tokenizer=tokenizer,
                     source=str(assets.resolve_model(name_or_path)))


@functools.lru_cache(maxsize=16)
def _window_forward(graphdef, spec: CacheSpec | None, cache_dtype_name: str):
  def forward(state, tokens_BxT):
    model = nnx.merge(graphdef, state)
    b, t = tokens_BxT.shape
    cache = init_cache(model.config, b, t, spec, jnp.dtype(cache_dtype_name))
    positions_BxT = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    logits, _ = model(tokens_BxT, positions_BxT, cache)
    return logits
  return jax.jit(forward)


def window_forward(model: LoadedModel, spec: CacheSpec | None = None,
                   cache_dtype=None):
  """A jitted fn(tokens_BxT) -> float32 logits of fresh windows.

  Every call starts from an empty cache of capacity T and prefills the window
  as one chunk; `spec` None is the full-precision cache in `cache_dtype`
  (default: the compute dtype).
  """
  graphdef, state = model.split
  dtype = jnp.dtype(model.decoder.dtype if cache_dtype is None else cache_dtype)
  fn = _window_forward(graphdef, spec, dtype.name)
  return lambda tokens_BxT: fn(state, jnp.asarray(tokens_BxT, jnp.int32))


def forward_logits(model: LoadedModel, ids) -> np.ndarray:
  """Full-precision forward pass: int ids [B, T] -> float32 logits [B, T, V]."""
  ids = np.asarray(ids)
  if ids.ndim != 2 or not np.issubdtype(ids.dtype, np.integer):
    raise ValueError(
        f"forward_logits: ids must be integer [B, T]; got {ids.dtype} "
        f"{ids.shape}.")
  if ids.size and (ids.min() < 0 or ids.max() >= model.config.vocab_size):
    raise ValueError(
        f"forward_logits: token ids must be in [0, {model.config.vocab_size}).")
  return np.asarray(window_forward(model)(ids), np.float32)
