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


def _one_window(graphdef, spec: CacheSpec | None, cache_dtype_name: str,
                state, tokens_T: jax.Array):
  """One window prefilled as one chunk into an empty cache of capacity T:
  (logits [T, V], the per-layer caches of batch size 1)."""
  model = nnx.merge(graphdef, state)
  t = tokens_T.shape[0]
  cache = init_cache(model.config, 1, t, spec, jnp.dtype(cache_dtype_name))
  positions_1xT = jnp.arange(t, dtype=jnp.int32)[None]
  logits, cache = model(tokens_T[None], positions_1xT, cache)
  return logits[0], cache


def windows_prefill_fn(graphdef, spec: CacheSpec | None,
                       cache_dtype_name: str, logits_only: bool = False):
  """fn(state, tokens_BxT) -> (logits_BxTxV, caches), not jitted; with
  `logits_only`, fn returns the logits alone.

  Windows run one after another (`lax.map`), each as the same batch-1
  program: XLA:CPU rounds matmuls and reductions differently for different
  batch sizes, so a batched forward would make the logits (and, through
  rare code flips at rounding boundaries, a quantized cache's perplexity)
  depend on `eval.batch_size` and on how a mesh splits the batch. This way a
  window's numbers depend on the window only. Cache leaves come back
  stacked, [B, 1, ...].
  """
  def run(state, tokens_BxT):
    out = jax.lax.map(
        lambda tokens_T: _one_window(graphdef, spec, cache_dtype_name, state,
                                     tokens_T), tokens_BxT)
    return out[0] if logits_only else out
  return run


def cache_dtype_name(model: "LoadedModel", cache_dtype=None) -> str:
  """The full-precision cache dtype's name; None means the compute dtype."""
  return jnp.dtype(model.decoder.dtype if cache_dtype is None
                   else cache_dtype).name


@functools.lru_cache(maxsize=32)
def _jitted(graphdef, spec: CacheSpec | None, dtype_name: str,
            logits_only: bool):
  return jax.jit(windows_prefill_fn(graphdef, spec, dtype_name, logits_only))


def _bind(model: "LoadedModel", spec: CacheSpec | None, cache_dtype,
          logits_only: bool):
  graphdef, state = model.split
  fn = _jitted(graphdef, spec, cache_dtype_name(model, cache_dtype),
               logits_only)
  return lambda tokens_BxT: fn(state, jnp.asarray(tokens_BxT, jnp.int32))


def window_forward(model: LoadedModel, spec: CacheSpec | None = None,
                   cache_dtype=None):
  """A jitted fn(tokens_BxT) -> float32 logits of fresh windows.

  Every window starts from an empty cache of capacity T and is prefilled as
  one chunk (`windows_prefill_fn`: one window at a time, so results do not
  depend on the batch size); `spec` None is the full-precision cache in
  `cache_dtype` (default: the compute dtype).
  """
  return _bind(model, spec, cache_dtype, logits_only=True)


def window_prefill(model: LoadedModel, spec: CacheSpec | None = None,
                   cache_dtype=None):
  """Like `window_forward`, returning (logits, caches) with every cache leaf
  stacked over the windows, [B, 1, ...]."""
  return _bind(model, spec, cache_dtype, logits_only=False)


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
