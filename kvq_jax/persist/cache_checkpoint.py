"""Saving and restoring a whole-model KV cache (a persisted prompt cache).

Layout of `save_cache(path, cache, metadata)`:

  path/cache.json   the static structure: format version, per layer its kind
                    ('dense' | 'quantized'), capacity, batch size, KV heads,
                    head_dim, full-precision dtype, the LayerSpec (quantized),
                    and every leaf's name, shape, dtype and sha256; plus the
                    caller's JSON-serialisable `metadata`.
  path/leaves/      the array leaves (orbax StandardCheckpointer), as
                    {"layer_<i>": {"leaf_<j>": array}}; zero-size leaves (an
                    empty sink/window) are not written, only described.

`restore_cache(path, like=None)` rebuilds the cache from the sidecar alone
(`like` is optional): the structure is re-created with `jax.eval_shape` of the
same `create(...)` call, checked against the sidecar, and the leaves restored
into it. With `like` (e.g. `init_cache(...)` of the expected spec), the saved
structure must equal `like`'s -- same kinds, capacities, specs, shapes and
dtypes -- or ValueError says which layer/leaf differs. Leaves are compared
with their saved sha256, so a restore is bit-exact or fails.

Every problem -- missing or truncated files, a sidecar that does not parse or
does not match the leaves, a spec or shape mismatch -- is a ValueError naming
the checkpoint path and what is wrong. Leaves are restored to the default
device (reshard with `kvq_jax.sharding.shard_cache`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pathlib
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from kvq_jax.cache.dense import DenseLayerCache
from kvq_jax.cache.key_affine import KeyAffine
from kvq_jax.cache.quantized import QuantizedLayerCache
from kvq_jax.cache.sliding import SlidingDenseLayerCache
from kvq_jax.cache.sliding_quantized import SlidingQuantizedLayerCache
from kvq_jax.cache.spec import LayerSpec
from kvq_jax.quant import QuantSpec

FORMAT_VERSION = 1
SIDECAR = "cache.json"
LEAVES = "leaves"
LEAF_KEYS = ("name", "shape", "dtype", "sha256")  # Each leaf's sidecar entry.


def _spec_to_json(spec: LayerSpec) -> dict:
  out = dataclasses.asdict(spec)
  if isinstance(spec.attention_impl, tuple):
    out["attention_impl"] = list(spec.attention_impl)
  return out


def _spec_from_json(data: dict) -> LayerSpec:
  data = dict(data)
  for name in ("k", "v"):
    if data.get(name) is not None:
      data[name] = QuantSpec(**data[name])
  if isinstance(data.get("attention_impl"), list):
    data["attention_impl"] = tuple(data["attention_impl"])
  if data.get("rotation_key") is not None:
    data["rotation_key"] = tuple(data["rotation_key"])
  if data.get("key_affine") is not None:
    data["key_affine"] = KeyAffine(**data["key_affine"])
  return LayerSpec(**data)


def _describe_layer(layer) -> dict:
  if isinstance(layer, DenseLayerCache):
    b, _, k, h = layer.k_BxSxKxH.shape
    entry = {"kind": "dense", "dtype": jnp.dtype(layer.k_BxSxKxH.dtype).name}
  elif isinstance(layer, SlidingDenseLayerCache):
    b, _, k, h = layer.k_BxRxKxH.shape
    entry = {"kind": "dense_ring", "dtype": jnp.dtype(layer.k_BxRxKxH.dtype).name,
             "sliding_window": layer.sliding_window}
  elif isinstance(layer, (QuantizedLayerCache, SlidingQuantizedLayerCache)):
    b, k, _, h = layer.window_k.shape
    entry = {"kind": "quantized", "spec": _spec_to_json(layer.spec),
             "dtype": layer.dtype.name}
    if isinstance(layer, SlidingQuantizedLayerCache):
      entry.update(kind="quantized_ring", sliding_window=layer.sliding_window)
  else:
    raise ValueError(
        f"save_cache: layer cache of type {type(layer).__name__} is not "
        "supported; allowed: DenseLayerCache, QuantizedLayerCache and their "
        "Sliding* ring variants.")
  entry.update(capacity=layer.capacity, batch_size=int(b), num_kv_heads=int(k),
               head_dim=int(h))
  return entry


def _leaf_info(layer) -> list[dict]:
  out = []
  for key, leaf in jax.tree_util.tree_leaves_with_path(layer):
    host = np.asarray(jax.device_get(leaf))
    out.append({"name": jax.tree_util.keystr(key), "shape": list(host.shape),
                "dtype": host.dtype.name,
                "sha256": hashlib.sha256(host.tobytes()).hexdigest()})
  return out


def _check_leaf_entry(desc, where: str) -> None:
  """Raises ValueError unless a sidecar leaf entry is what `_leaf_info`
  writes: an object with every key of LEAF_KEYS."""
  if not isinstance(desc, dict):
    raise ValueError(f"{where}: the sidecar's leaf entry is a "
                     f"{type(desc).__name__}; allowed: an object with "
                     f"{', '.join(LEAF_KEYS)}.")
  missing = [k for k in LEAF_KEYS if k not in desc]
  if missing:
    raise ValueError(f"{where}: the sidecar's leaf entry has no "
                     f"{', '.join(missing)}; allowed: an object with "
                     f"{', '.join(LEAF_KEYS)}.")


def _abstract_layer(entry: dict, where: str):
  """The layer's structure (ShapeDtypeStruct leaves) from its sidecar entry."""
  try:
    args = (entry["batch_size"], entry["capacity"], entry["num_kv_heads"],
            entry["head_dim"])
    dtype = jnp.dtype(entry["dtype"])
    if entry["kind"] == "dense":
      return jax.eval_shape(lambda: DenseLayerCache.create(*args, dtype))
    if entry["kind"] == "dense_ring":
      return jax.eval_shape(lambda: SlidingDenseLayerCache.create(
          *args, dtype, sliding_window=entry["sliding_window"]))
    if entry["kind"] in ("quantized", "quantized_ring"):
      spec = _spec_from_json(entry["spec"])
      if entry["kind"] == "quantized_ring":
        return jax.eval_shape(lambda: SlidingQuantizedLayerCache.create(
            spec, *args, dtype, sliding_window=entry["sliding_window"]))
      return jax.eval_shape(
          lambda: QuantizedLayerCache.create(spec, *args, dtype))
    raise ValueError(f"kind={entry['kind']!r}; allowed: dense, dense_ring, "
                     "quantized, quantized_ring")
  except (KeyError, TypeError, ValueError, AttributeError) as e:
    raise ValueError(f"{where}: the layer description is invalid: {e}") from e


def save_cache(path: str | os.PathLike, cache: Sequence,
               metadata: dict[str, Any] | None = None) -> pathlib.Path:
  """Writes `cache` (a list of layer caches) to the new directory `path`.

  `metadata` (JSON-serialisable, e.g. the prompt ids and model name) is
  stored in the sidecar and returned by `restore_cache`. Raises ValueError
  if `path` exists or `metadata` is not JSON-serialisable.
  """
  path = pathlib.Path(path)
  if path.exists():
    raise ValueError(f"save_cache: {str(path)!r} already exists; allowed: a "
                     "new directory (checkpoints are never overwritten).")
  layers = []
  for layer in cache:
    entry = _describe_layer(layer)
    entry["leaves"] = _leaf_info(layer)
    layers.append(entry)
  sidecar = {"format_version": FORMAT_VERSION, "num_layers": len(layers),
             "layers": layers, "metadata": metadata}
  try:
    text = json.dumps(sidecar, indent=1)
  except TypeError as e:
    raise ValueError(f"save_cache: metadata is not JSON-serialisable: {e}"
                     ) from e
  tree = {f"layer_{i}": {f"leaf_{j}": leaf for j, leaf in enumerate(
      jax.tree_util.tree_leaves(layer)) if leaf.size}
          for i, layer in enumerate(cache)}
  path.mkdir(parents=True)
  checkpointer = ocp.StandardCheckpointer()
  checkpointer.save(path / LEAVES, tree)
  checkpointer.wait_until_finished()
  (path / SIDECAR).write_text(text)  # Written last: marks completion.
  return path


def _read_sidecar(path: pathlib.Path) -> dict:
  sidecar = path / SIDECAR
  if not sidecar.is_file():
    raise ValueError(
        f"restore_cache: {str(sidecar)!r} is missing: not a saved cache or "
        "an interrupted save.")
  try:
    data = json.loads(sidecar.read_text())
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise ValueError(
        f"restore_cache: {str(sidecar)!r} is not valid JSON (truncated or "
        f"corrupted): {e}") from e
  if not isinstance(data, dict) or data.get("format_version") != FORMAT_VERSION:
    raise ValueError(
        f"restore_cache: {str(sidecar)!r} has format_version="
        f"{data.get('format_version') if isinstance(data, dict) else None!r};"
        f" allowed: {FORMAT_VERSION}.")
  if not isinstance(data.get("layers"), list) or not data["layers"]:
    raise ValueError(f"restore_cache: {str(sidecar)!r} lists no layers.")
  return data


def _check_like(path, abstract: list, like: Sequence) -> None:
  if len(like) != len(abstract):
    raise ValueError(
        f"restore_cache: {str(path)!r} holds {len(abstract)} layers; like has "
        f"{len(like)}.")
  for i, (saved, want) in enumerate(zip(abstract, like)):
    if type(saved) is not type(want):
      raise ValueError(
          f"restore_cache: {str(path)!r} layer {i} is a {type(saved).__name__}"
          f"; like has a {type(want).__name__}.")
    if saved.capacity != want.capacity:
      raise ValueError(
          f"restore_cache: {str(path)!r} layer {i}: saved capacity="
          f"{saved.capacity}, like has capacity={want.capacity}.")
    if getattr(saved, "spec", None) != getattr(want, "spec", None):
      raise ValueError(
          f"restore_cache: {str(path)!r} layer {i}: saved spec {saved.spec} "
          f"differs from like's {want.spec}.")
    s_leaves, s_def = jax.tree_util.tree_flatten(saved)
    w_leaves, w_def = jax.tree_util.tree_flatten(want)
    if s_def != w_def:
      raise ValueError(
          f"restore_cache: {str(path)!r} layer {i}: saved structure (capacity"
          f"/spec) {s_def} differs from like's {w_def}.")
    for j, (s, w) in enumerate(zip(s_leaves, w_leaves)):
      if s.shape != w.shape or s.dtype != w.dtype:
        raise ValueError(
            f"restore_cache: {str(path)!r} layer {i} leaf {j}: saved "
            f"{s.dtype}{list(s.shape)}, like has {w.dtype}{list(w.shape)}.")


def restore_cache(path: str | os.PathLike, like: Sequence | None = None
                  ) -> tuple[list, Any]:
  """Returns (cache, metadata) saved by `save_cache` (module docstring)."""
  path = pathlib.Path(path)
  data = _read_sidecar(path)
  abstract, infos = [], []
  for i, entry in enumerate(data["layers"]):
    where = f"restore_cache: {str(path / SIDECAR)!r} layer {i}"
    layer = _abstract_layer(entry, where)
    leaves = jax.tree_util.tree_leaves_with_path(layer)
    info = entry.get("leaves")
    if not isinstance(info, list) or len(info) != len(leaves):
      raise ValueError(
          f"{where}: lists {len(info) if isinstance(info, list) else 0} "
          f"leaves; its spec/capacity imply {len(leaves)}.")
    for (key, leaf), desc in zip(leaves, info):
      _check_leaf_entry(desc, f"{where} leaf {jax.tree_util.keystr(key)}")
      if (list(leaf.shape) != desc.get("shape")
          or jnp.dtype(leaf.dtype).name != desc.get("dtype")):
        raise ValueError(
            f"{where} leaf {jax.tree_util.keystr(key)}: the sidecar says "
            f"{desc.get('dtype')}{desc.get('shape')}, the spec/capacity imply "
            f"{jnp.dtype(leaf.dtype).name}{list(leaf.shape)}.")
    abstract.append(layer)
    infos.append(info)
  if like is not None:
    _check_like(path, abstract, like)
  target = {f"layer_{i}": {
      f"leaf_{j}": np.empty(leaf.shape, leaf.dtype)
      for j, leaf in enumerate(jax.tree_util.tree_leaves(layer)) if leaf.size}
            for i, layer in enumerate(abstract)}
  if not (path / LEAVES).is_dir():
    raise ValueError(f"restore_cache: {str(path / LEAVES)!r} is missing.")
  try:
    restored = ocp.StandardCheckpointer().restore(path / LEAVES, target)
  except Exception as e:  # orbax/tensorstore raise many types.
    raise ValueError(
        f"restore_cache: cannot read the leaves under {str(path / LEAVES)!r} "
        f"(missing, truncated or corrupted files): {type(e).__name__}: {e}"
    ) from e
  cache = []
  for i, (layer, info) in enumerate(zip(abstract, infos)):
    leaves, treedef = jax.tree_util.tree_flatten(layer)
    values = []
    for j, (leaf, desc) in enumerate(zip(leaves, info)):
      value = (np.zeros(leaf.shape, leaf.dtype) if not leaf.size else
               np.asarray(restored[f"layer_{i}"][f"leaf_{j}"]))
      if (value.shape != leaf.shape or value.dtype != leaf.dtype or
          hashlib.sha256(value.tobytes()).hexdigest() != desc["sha256"]):
        raise ValueError(
            f"restore_cache: {str(path)!r} layer {i} leaf {desc['name']}: "
            "restored bytes do not match the saved sha256 (corrupted leaf "
            "files).")
      values.append(jnp.asarray(value))
    cache.append(jax.tree_util.tree_unflatten(treedef, values))
  return cache, data.get("metadata")
