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
from kvq_jax import loaders
from kvq_jax.cache.factory import init_cache
from kvq_jax.cache.spec import CacheSpec
from kvq_jax.loaders.tokenizer import TextTokenizer
from kvq_jax.models.config import ModelConfig
from kvq_jax.models.decoder import Decoder
from kvq_jax.models.dtypes import parse_dtype
from kvq_jax.models.params import decoder_from_params


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
  # The loader's numpy tree is ours: free each leaf once it is on the
  # device, so the weights are never held twice.
  decoder = decoder_from_params(config, params, dtype=jdtype,
                                param_dtype=jdtype, consume=True)
  del params
  return LoadedModel(decoder=decoder, tokenizer=tokenizer,
                     source=str(assets.resolve_model(name_or_path)))


def model_config(name_or_path: str | os.PathLike = assets.DEFAULT_MODEL
                 ) -> ModelConfig:
  """A model's architecture (real shapes) without loading its weights.

  A registered name is fetched once like `load_model`; only the file's
  metadata and tensor table are read.
  """
  return loaders.load_config(assets.resolve_model(name_or_path))


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


def check_chunk_keep(window_len: int | None, chunk: int,
                     keep: int | None) -> int | None:
  """Validates a chunked prefill's arguments; returns keep (None -> T).

  `window_len` None (not known yet) checks only that keep is >= 1.
  """
  if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
    raise ValueError(f"eval.prefill_chunk={chunk!r}: allowed: an integer "
                     ">= 1 (tokens per prefill call).")
  keep = window_len if keep is None else keep
  if keep is None:
    return None
  limit = window_len or keep
  if isinstance(keep, bool) or not isinstance(keep, int) \
      or not 1 <= keep <= limit:
    raise ValueError(f"chunked prefill: keep={keep!r} logits positions; "
                     f"allowed: 1..{window_len or 'T'} (the window length).")
  return keep


def _one_window_chunked(graphdef, spec: CacheSpec | None,
                        cache_dtype_name: str, chunk: int, keep: int | None,
                        state, tokens_T: jax.Array) -> jax.Array:
  """One window prefilled in chunks of `chunk` tokens into an empty cache of
  capacity T: float32 logits [keep, V] of positions [T - keep, T).

  Chunk c covers positions [c * chunk, min((c + 1) * chunk, T)); a chunk
  size that does not divide T leaves a shorter last chunk. Full chunks run
  in `lax.scan` (one compiled model call, the cache as the carry): those
  entirely before position T - keep return no logits, the others return
  theirs ([chunk, V] each, at most keep + chunk - 1 positions in all); the
  short last chunk is one more call. Peak memory is therefore the cache,
  one chunk's activations (attention reads the cache block by block: the
  dense cache's scores are [1, K, G, chunk, 512] float32 per block,
  `cache.dense.ATTENTION_BLOCK`) and the kept logits: never a [T, T] matrix
  or [T, V] logits for T > chunk + keep.
  """
  t = tokens_T.shape[0]
  keep = check_chunk_keep(t, chunk, keep)
  config = nnx.merge(graphdef, state).config
  cache = init_cache(config, 1, t, spec, jnp.dtype(cache_dtype_name))

  def call(cache, start, size: int):
    tokens_1xC = jax.lax.dynamic_slice_in_dim(tokens_T, start, size)[None]
    positions_1xC = (start + jnp.arange(size, dtype=jnp.int32))[None]
    logits_1xCxV, cache = nnx.merge(graphdef, state)(tokens_1xC,
                                                     positions_1xC, cache)
    return logits_1xCxV[0], cache

  num_full, rest = divmod(t, chunk)
  num_unscored = min((t - keep) // chunk, num_full)
  if num_unscored:
    cache, _ = jax.lax.scan(
        lambda cache, c: (call(cache, c * chunk, chunk)[1], None), cache,
        jnp.arange(num_unscored, dtype=jnp.int32))
  pieces = []
  if num_full > num_unscored:
    def scored(cache, c):
      logits_CxV, cache = call(cache, c * chunk, chunk)
      return cache, logits_CxV
    cache, logits_NxCxV = jax.lax.scan(
        scored, cache, jnp.arange(num_unscored, num_full, dtype=jnp.int32))
    pieces.append(logits_NxCxV.reshape(-1, logits_NxCxV.shape[-1]))
  if rest:
    pieces.append(call(cache, jnp.int32(num_full * chunk), rest)[0])
  logits_PxV = jnp.concatenate(pieces, axis=0) if len(pieces) > 1 \
      else pieces[0]
  return logits_PxV[logits_PxV.shape[0] - keep:]


def windows_chunked_prefill_fn(graphdef, spec: CacheSpec | None,
                               cache_dtype_name: str, chunk: int,
                               keep: int | None = None):
  """fn(state, tokens_BxT) -> float32 logits [B, keep, V] of positions
  [T - keep, T) (keep None: all T), not jitted.

  Like `windows_prefill_fn` (one batch-1 program per window via `lax.map`,
  so a window's numbers never depend on the batch size), but each window is
  prefilled in chunks of `chunk` tokens (`_one_window_chunked`), the cache
  written piece by piece as a server would, and only the last `keep`
  positions' logits are returned.
  """
  def run(state, tokens_BxT):
    return jax.lax.map(
        lambda tokens_T: _one_window_chunked(graphdef, spec, cache_dtype_name,
                                             chunk, keep, state, tokens_T),
        tokens_BxT)
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


@functools.lru_cache(maxsize=32)
def _jitted_chunked(graphdef, spec: CacheSpec | None, dtype_name: str,
                    chunk: int, keep: int | None):
  return jax.jit(windows_chunked_prefill_fn(graphdef, spec, dtype_name, chunk,
                                            keep))


def clear_compiled_windows() -> None:
  """Drops every compiled window program (`window_forward`,
  `chunked_window_forward`, and JAX's own caches); the next call compiles
  again. For runs whose shapes never recur (each context of a curve)."""
  _jitted.cache_clear()
  _jitted_chunked.cache_clear()
  jax.clear_caches()


def chunked_window_forward(model: LoadedModel, spec: CacheSpec | None = None,
                           cache_dtype=None, *, chunk: int,
                           keep: int | None = None):
  """A jitted fn(tokens_BxT) -> float32 logits [B, keep, V] of each fresh
  window's last `keep` positions (None: all T), the window prefilled in
  chunks of `chunk` tokens (`windows_chunked_prefill_fn`; a last chunk
  shorter than `chunk` when it does not divide T). `spec` and `cache_dtype`
  as in `window_forward`. With chunk >= T this is `window_forward`'s
  one-chunk prefill, restricted to the kept positions.
  """
  check_chunk_keep(None, chunk, keep)  # Fail before compiling.
  graphdef, state = model.split
  fn = _jitted_chunked(graphdef, spec, cache_dtype_name(model, cache_dtype),
                       chunk, keep)
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
