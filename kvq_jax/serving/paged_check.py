"""One layer's paged cache against its contiguous twin, step by step.

`compare(config, spec, layer)` drives a `PagedLayerCache` (its pages
scattered at random in the pool) and the contiguous cache
`cache.factory.layer_cache` builds for the same layer through the same
calls, with random queries, keys and values of the layer's shapes: a
ragged start (slot 0 prefilled with 37 tokens, slot 1 with 74 in two
chunks, each slot alone through `select_slots` / `merge_slots`), a chunked
prefill of 16 tokens for both, then `DECODE_STEPS` decode steps. It returns
the largest absolute difference of the attention outputs over every call.
Three shapes compile per cache. Used by tests/cache/test_paged.py and
`experiments.paged_check` (every distinct layer of every preset).
"""

from __future__ import annotations

import dataclasses
import functools
import pathlib
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from kvq_jax.cache.factory import layer_cache
from kvq_jax.cache.paged.layer import PagedLayerCache
from kvq_jax.cache.paged.model import (merge_slots, paged_layer_spec,
                                       select_slots, with_block_table)
from kvq_jax.cache.key_stats_recipe import recipe_shape
from kvq_jax.cache.spec import CacheSpec, LayerSpec
from kvq_jax.models.config import ModelConfig
from kvq_jax.models.decoder import layer_rope
from kvq_jax.persist.key_stats_store import save_identity_key_stats
from kvq_jax.settings.experiment_settings import settings_from_config
from kvq_jax.settings.presets import load_preset

PAGE = 32
MAX_PAGES = 6  # 192 tokens per slot.
NUM_PAGES = 16  # 12 in use (2 slots x 6), page 0 null.
PREFILL = 37  # slot 0: one chunk; slot 1: two.
CHUNK = 16
DECODE_STEPS = 64


@functools.partial(jax.jit, static_argnums=0)
def _attend(rope, layer, q, k, v, positions):
  return layer.attend(q, k, v, positions, rope)


def _tokens(config: ModelConfig, rng, b, t):
  n, kh, h = config.num_heads, config.num_kv_heads, config.head_dim
  draw = lambda heads: jnp.asarray(rng.normal(size=(b, t, heads, h)),
                                   jnp.float32)
  return draw(n), draw(kh), draw(kh)


def scattered_table(seed: int, slots: int = 2) -> np.ndarray:
  """Each slot's MAX_PAGES pages drawn at random from pages 1..N-1."""
  rng = np.random.default_rng(seed)
  pages = rng.permutation(np.arange(1, NUM_PAGES))[:slots * MAX_PAGES]
  return pages.reshape(slots, MAX_PAGES).astype(np.int32)


def make_pair(config: ModelConfig, spec: CacheSpec | None, layer: int = 0,
              seed: int = 0, dtype=jnp.float32):
  """(contiguous, paged) caches of layer `layer` of `spec`, 2 slots;
  `dtype` the cache dtype (a dense layer's storage)."""
  contiguous = layer_cache(config, layer, 2, MAX_PAGES * PAGE, spec, dtype)
  paged = PagedLayerCache.create_paged(
      paged_layer_spec(spec, layer), 2, NUM_PAGES, MAX_PAGES,
      config.num_kv_heads, config.head_dim, dtype, page_size=PAGE)
  paged = with_block_table([paged], scattered_table(seed))[0]
  return contiguous, paged


def _step(rope, layer, q, k, v):
  positions = layer.length_B[:, None] + jnp.arange(q.shape[1])[None, :]
  return _attend(rope, layer, q, k, v, positions)


def compare(config: ModelConfig, spec: CacheSpec | None, layer: int = 0,
            seed: int = 0, decode_steps: int = DECODE_STEPS,
            dtype=jnp.float32) -> float:
  """Largest |paged - contiguous| attention output over every call."""
  rope = layer_rope(config, layer)
  caches = list(make_pair(config, spec, layer, seed, dtype))
  rng = np.random.default_rng(seed + 1)
  worst = 0.0

  def run(slots, q, k, v):
    nonlocal worst
    outs = []
    for i, cache in enumerate(caches):
      if len(slots) == 2:
        out, caches[i] = _step(rope, cache, q, k, v)
      else:
        sub = select_slots([cache], slots)[0]
        out, sub = _step(rope, sub, q, k, v)
        caches[i] = merge_slots([cache], [sub], slots)[0]
      outs.append(np.asarray(out))
    worst = max(worst, float(np.max(np.abs(outs[0] - outs[1]))))

  for slot in (0, 1, 1):
    run([slot], *_tokens(config, rng, 1, PREFILL))
  run([0, 1], *_tokens(config, rng, 2, CHUNK))
  for _ in range(decode_steps):
    run([0, 1], *_tokens(config, rng, 2, 1))
  return worst


def code_path(layer: LayerSpec) -> tuple:
  """What decides which code runs for a layer spec: the spec with its
  calibrated numbers (the key affine's shift, scale and levels, the
  rotation's per-layer key) replaced by whether they are there."""
  affine = layer.key_affine
  shape = None if affine is None else (affine.mode, bool(affine.codebooks))
  return (dataclasses.replace(layer, key_affine=None, rotation_key=None),
          shape, layer.rotation_key is not None)


def distinct_layers(spec: CacheSpec, num_layers: int) -> list[int]:
  """The first layer of every distinct `code_path` in `spec`."""
  seen, out = set(), []
  for i in range(num_layers):
    key = code_path(spec.layer(i))
    if key not in seen:
      seen.add(key)
      out.append(i)
  return out


def _with_key_stats(preset, config: ModelConfig, stand_in_root: pathlib.Path
                    ) -> str:
  """Points a preset whose key statistics are missing at identity stand-ins
  of `config`'s shape (a recipe's mode; else range mode for static keys,
  std otherwise); returns a
  note, '' when its own statistics are used."""
  path = preset.cache.key_stats
  if not path or pathlib.Path(path).is_dir():
    return ""
  mode = "range" if preset.cache.k.scheme == "static" else "std"
  mode, rotated = recipe_shape(path) or (mode, None)
  root = stand_in_root / (mode + ("-rotated" if rotated else ""))
  if not root.is_dir():
    save_identity_key_stats(root, config.num_layers, config.num_kv_heads,
                            config.head_dim, mode, rotated)
  with preset.unlocked():
    preset.cache.key_stats = str(root)
  return f"{path} missing: identity {mode} key stats (same code path)"


def check_presets(config: ModelConfig, names: Sequence[str],
                  stand_in_root: str | pathlib.Path) -> list[dict]:
  """Per preset and distinct layer (`distinct_layers`): the largest
  |paged - contiguous| attention output (`compare`), or the reason the
  paged cache refused it."""
  rows = []
  for name in names:
    preset = load_preset(name)
    note = _with_key_stats(preset, config, pathlib.Path(stand_in_root))
    settings = settings_from_config(preset)
    spec = settings.cache_spec if settings.quantize else None
    layers = [0] if spec is None else distinct_layers(spec,
                                                      config.num_layers)
    for i in layers:
      row = {"preset": name, "layer": i, "note": note}
      try:
        row["max_abs_diff"] = compare(config, spec, i,
                                      dtype=settings.cache_dtype)
      except ValueError as e:
        row["refused"] = str(e)
      rows.append(row)
      print(f"{name} layer {i}: "
            + (f"max |paged - contiguous| {row['max_abs_diff']:.3g}"
               if "max_abs_diff" in row else f"refused: {row['refused']}")
            + (f" ({note})" if note else ""), flush=True)
    # Every layer compiles its own programs: dropped per preset, or a sweep
    # of every preset runs out of memory.
    jax.clear_caches()
  return rows
