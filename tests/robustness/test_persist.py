"""kvq_jax.persist: a quantized prompt cache saved mid-generation."""

from __future__ import annotations

import dataclasses
import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kvq_jax.cache.factory import init_cache
from kvq_jax.cache.key_affine import KeyAffine
from kvq_jax.cache.spec import CacheSpec
from kvq_jax.models.params import decoder_from_params, random_params
from kvq_jax.models.runtime import Runtime
from kvq_jax.persist import cache_checkpoint, restore_cache, save_cache
from kvq_jax.persist import key_stats_store
from kvq_jax.quant import QuantSpec
from tests.robustness import tiny

CAPACITY = 32
PROMPT = jnp.asarray([[5, 17, 3, 42, 8, 11], [1, 2, 3, 4, 5, 6]], jnp.int32)


def _step(rt, logits, cache):
  token = jnp.argmax(logits, -1).astype(jnp.int32)
  return rt.decode(token, cache)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
  """Prefill + 3 decode steps, save; then the uninterrupted 8-step run."""
  rt = tiny.runtime()
  logits, cache = rt.prefill(PROMPT, init_cache(tiny.CONFIG, 2, CAPACITY,
                                                tiny.MIXED))
  logits = logits[:, -1]
  for _ in range(3):
    logits, cache = _step(rt, logits, cache)
  path = tmp_path_factory.mktemp("persist") / "prompt_cache"
  host = jax.device_get(cache)  # Bit-exact copy before `cache` is donated.
  save_cache(path, cache, {"prompt": PROMPT.tolist(), "steps": 3})
  saved_logits = logits
  uninterrupted = []
  for _ in range(5):
    logits, cache = _step(rt, logits, cache)
    uninterrupted.append(np.asarray(logits))
  return {"path": path, "host": host, "logits": saved_logits,
          "uninterrupted": np.stack(uninterrupted)}


def test_restore_without_like_is_bit_exact_and_continues(saved):
  cache, metadata = restore_cache(saved["path"])
  assert metadata == {"prompt": PROMPT.tolist(), "steps": 3}
  assert [type(layer).__name__ for layer in cache] == [
      "DenseLayerCache", "QuantizedLayerCache"]
  assert cache[1].spec == tiny.MIXED.layer(1) and cache[1].capacity == CAPACITY
  want = jax.tree_util.tree_leaves_with_path(saved["host"])
  got = jax.tree_util.tree_leaves(cache)
  assert len(want) == len(got)
  for (key, w), g in zip(want, got):
    assert g.dtype == w.dtype and g.shape == w.shape, key
    np.testing.assert_array_equal(np.asarray(g).view(np.uint8),
                                  np.asarray(w).view(np.uint8), err_msg=str(key))
  assert jax.tree_util.tree_structure(cache) == jax.tree_util.tree_structure(
      saved["host"])
  rt, logits, resumed = tiny.runtime(), saved["logits"], []
  for _ in range(5):
    logits, cache = _step(rt, logits, cache)
    resumed.append(np.asarray(logits))
  np.testing.assert_array_equal(np.stack(resumed), saved["uninterrupted"])


def test_restore_with_matching_like(saved):
  like = init_cache(tiny.CONFIG, 2, CAPACITY, tiny.MIXED)
  cache, _ = restore_cache(saved["path"], like=like)
  np.testing.assert_array_equal(cache[1].length_B, [9, 9])


@pytest.mark.parametrize("like_kwargs, match", [
    (dict(spec=tiny.INT4), r"layer 0 is a DenseLayerCache; like has a "
     r"QuantizedLayerCache"),
    (dict(capacity=48), r"layer 0: saved capacity=32, like has capacity=48"),
    (dict(batch=1), r"layer 0 leaf 0"),
])
def test_like_with_other_structure_rejected(saved, like_kwargs, match):
  kw = dict(batch=2, capacity=CAPACITY, spec=tiny.MIXED) | like_kwargs
  like = init_cache(tiny.CONFIG, kw["batch"], kw["capacity"], kw["spec"])
  # Saved: [dense, int4]; like: [int4, int4] / other capacity / batch.
  with pytest.raises(ValueError, match=match) as info:
    restore_cache(saved["path"], like=like)
  assert str(saved["path"]) in str(info.value)


def _copy(saved, tmp_path) -> pathlib.Path:
  import shutil
  dst = tmp_path / "copy"
  dst.parent.mkdir(parents=True, exist_ok=True)
  shutil.copytree(saved["path"], dst)
  return dst


def _data_files(path: pathlib.Path) -> list[pathlib.Path]:
  """orbax's OCDBT data files (leaves/ocdbt.process_*/d/*), largest first."""
  files = [p for p in (path / "leaves").glob("ocdbt.process_*/d/*")
           if p.is_file()]
  assert files, list((path / "leaves").rglob("*"))
  return sorted(files, key=lambda p: p.stat().st_size, reverse=True)


def test_missing_sidecar(saved, tmp_path):
  path = _copy(saved, tmp_path)
  (path / "cache.json").unlink()
  with pytest.raises(ValueError, match=r"cache\.json' is missing"):
    restore_cache(path)


def test_truncated_sidecar(saved, tmp_path):
  path = _copy(saved, tmp_path)
  text = (path / "cache.json").read_text()
  (path / "cache.json").write_text(text[:len(text) // 2])
  with pytest.raises(ValueError, match=r"cache\.json' is not valid JSON"):
    restore_cache(path)


@pytest.mark.parametrize("edit, match", [
    (lambda d: d["layers"][1].update(capacity=64),
     r"layer 1 leaf .*k_store.*the sidecar says uint8\[2, 2, 32, 8\], the "
     r"spec/capacity imply uint8\[2, 2, 64, 8\]"),
    (lambda d: d["layers"][0]["leaves"][0].update(shape=[2, 32, 2, 8]),
     r"layer 0 leaf \.k_BxSxKxH: the sidecar says float32\[2, 32, 2, 8\]"),
    (lambda d: d["layers"][1]["spec"]["k"].update(format="int9"),
     r"layer 1: the layer description is invalid: QuantSpec.format='int9'"),
    (lambda d: d["layers"][1].update(kind="sparse"),
     r"kind='sparse'; allowed: dense, dense_ring, quantized, quantized_ring"),
    (lambda d: d["layers"][1]["spec"].update(residual=0),
     r"layer 1: lists 9 leaves; its spec/capacity imply 9|layer 1 leaf"),
    (lambda d: d.update(format_version=0), r"format_version=0; allowed: 1"),
    (lambda d: d["layers"][0]["leaves"].__setitem__(0, [2, 32, 2, 8]),
     r"layer 0 leaf \.k_BxSxKxH: the sidecar's leaf entry is a list; "
     r"allowed: an object with name, shape, dtype, sha256"),
    (lambda d: d["layers"][1]["leaves"][2].pop("sha256"),
     r"layer 1 leaf .*: the sidecar's leaf entry has no sha256"),
])
def test_mismatched_sidecar(saved, tmp_path, edit, match):
  path = _copy(saved, tmp_path)
  data = json.loads((path / "cache.json").read_text())
  edit(data)
  (path / "cache.json").write_text(json.dumps(data))
  with pytest.raises(ValueError, match=match) as info:
    restore_cache(path)
  assert str(path) in str(info.value)


def _assert_bit_exact(cache, host):
  for got, want in zip(jax.tree_util.tree_leaves(cache),
                       jax.tree_util.tree_leaves(host)):
    np.testing.assert_array_equal(np.asarray(got).view(np.uint8),
                                  np.asarray(want).view(np.uint8))


@pytest.mark.parametrize("how", ["delete", "truncate", "flip"])
def test_damaged_leaf_file_raises_or_restores_exactly(saved, tmp_path, how):
  """Damage each orbax file in turn: a ValueError naming the checkpoint, or
  (a file the restore does not read) the exact saved leaves -- never silently
  wrong data (the sidecar's per-leaf sha256 catches what orbax does not)."""
  raised = 0
  files = [p.relative_to(saved["path"]) for p in _data_files(saved["path"])]
  files += [p.relative_to(saved["path"])
            for p in (saved["path"] / "leaves").rglob("manifest.ocdbt")]
  for i, name in enumerate(files):
    path = _copy(saved, tmp_path / str(i))
    target = path / name
    data = bytearray(target.read_bytes())
    if how == "delete":
      target.unlink()
    elif how == "truncate":
      target.write_bytes(bytes(data[:len(data) // 2]))
    else:
      data[len(data) // 2] ^= 0xFF
      target.write_bytes(bytes(data))
    try:
      cache, _ = restore_cache(path)
    except ValueError as e:
      assert str(path) in str(e), e
      raised += 1
      continue
    _assert_bit_exact(cache, saved["host"])
  assert raised >= 1, files


def test_deleted_leaves_dir(saved, tmp_path):
  import shutil
  path = _copy(saved, tmp_path)
  shutil.rmtree(path / "leaves")
  with pytest.raises(ValueError, match=r"leaves' is missing"):
    restore_cache(path)


def test_save_refuses_existing_path_and_bad_metadata(saved, tmp_path):
  cache = init_cache(tiny.CONFIG, 1, 16, tiny.INT4)
  with pytest.raises(ValueError, match="already exists"):
    save_cache(saved["path"], cache)
  with pytest.raises(ValueError, match="metadata is not JSON-serialisable"):
    save_cache(tmp_path / "x", cache, {"ids": object()})
  assert not (tmp_path / "x").exists()


def test_sliding_window_rings_round_trip_and_continue(tmp_path):
  """Local layers' rings (dense and quantized) save and restore bit-exactly,
  after the prompt has wrapped them, and decoding continues identically."""
  config = dataclasses.replace(tiny.CONFIG, sliding_window=4,
                               local_layers=(0, 1))
  rt = Runtime(decoder_from_params(config, random_params(config, 0,
                                                         scale=0.1)))
  spec = dataclasses.replace(tiny.MIXED, sink=0)
  logits, cache = rt.prefill(PROMPT, init_cache(config, 2, CAPACITY, spec))
  assert [type(layer).__name__ for layer in cache] == [
      "SlidingDenseLayerCache", "SlidingQuantizedLayerCache"]
  logits = logits[:, -1]
  host = jax.device_get(cache)
  save_cache(tmp_path / "ring", cache)
  want, step_logits = [], logits
  for _ in range(3):
    step_logits, cache = _step(rt, step_logits, cache)
    want.append(np.asarray(step_logits))
  restored, _ = restore_cache(tmp_path / "ring")
  for w, g in zip(jax.tree_util.tree_leaves(host),
                  jax.tree_util.tree_leaves(restored)):
    np.testing.assert_array_equal(np.asarray(g).view(np.uint8),
                                  np.asarray(w).view(np.uint8))
  assert restored[1].sliding_window == 4
  got, step_logits = [], logits
  for _ in range(3):
    step_logits, restored = _step(rt, step_logits, restored)
    got.append(np.asarray(step_logits))
  np.testing.assert_array_equal(np.stack(got), np.stack(want))


def test_layer_spec_json_round_trip_with_calibrated_keys():
  """Static keys with levels and outliers, a key affine with a codebook, a
  randomised rotation: the sidecar's spec restores equal (JSON turns the
  tuples into lists)."""
  affine = KeyAffine.from_arrays(np.zeros((2, 4)), np.ones((2, 4)), "range",
                                 {2: [-1.0, -0.25, 0.25, 1.0]})
  spec = CacheSpec(
      k=QuantSpec("int2", "static", "per_token", outliers=1),
      v=QuantSpec("int4", "lloyd_max", "per_token"), key_rope="pre",
      hadamard_v=True, rotation_seed=3, sink=1,
      key_affines=(affine,)).layer(0)
  assert spec.k.levels == (-1.0, -0.25, 0.25, 1.0)
  text = json.dumps(cache_checkpoint._spec_to_json(spec))  # pylint: disable=protected-access
  assert cache_checkpoint._spec_from_json(json.loads(text)) == spec  # pylint: disable=protected-access


def _save_stand_in(path: pathlib.Path, num_layers: int) -> pathlib.Path:
  """Identity key stats of `num_layers` layers (2 KV heads of 8 dims)."""
  return key_stats_store.save_identity_key_stats(path, num_layers, 2, 8,
                                                 "std")


def test_key_stats_are_written_aside_and_replaced_whole(tmp_path,
                                                       monkeypatch):
  path = _save_stand_in(tmp_path / "ks", 2)
  assert sorted(p.name for p in path.iterdir()) == [
      "affine", "complete.json", "key_stats.json"]
  _save_stand_in(path, 3)  # An earlier key-stats directory: replaced.
  assert len(key_stats_store.load_key_stats(path)) == 3
  with monkeypatch.context() as m:  # A save that dies half way ...
    def die(*args, **kwargs):
      raise OSError("disk gone")
    m.setattr(key_stats_store.ocp.StandardCheckpointer, "save", die)
    with pytest.raises(OSError, match="disk gone"):
      _save_stand_in(path, 4)
  # ... leaves the last whole one, and nothing beside it.
  assert len(key_stats_store.load_key_stats(path)) == 3
  assert [p.name for p in tmp_path.iterdir()] == ["ks"]


def test_key_stats_save_refuses_a_folder_holding_other_files(tmp_path):
  (tmp_path / "notes.txt").write_text("mine")
  with pytest.raises(ValueError, match=r"holds notes\.txt besides key "
                     r"statistics.*allowed: a new or empty directory"):
    _save_stand_in(tmp_path, 2)
  assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]


@pytest.mark.parametrize("how, match", [
    ("flip", r"checksum differs from complete\.json's"),
    ("truncate", r"has \d+ bytes, complete\.json says \d+"),
    ("delete", r"is missing"),
])
def test_damaged_key_stats_are_refused(tmp_path, how, match):
  path = _save_stand_in(tmp_path / "ks", 2)
  target = max((p for p in (path / "affine").rglob("*") if p.is_file()),
               key=lambda p: p.stat().st_size)
  data = bytearray(target.read_bytes())
  if how == "flip":
    data[len(data) // 2] ^= 0xFF
    target.write_bytes(bytes(data))
  elif how == "truncate":
    target.write_bytes(bytes(data[:len(data) // 2]))
  else:
    target.unlink()
  with pytest.raises(ValueError, match=rf"key stats '{path}' are damaged "
                     rf"\(.*{match}.*\); allowed: an intact directory"):
    key_stats_store.load_key_stats(path)


def test_key_stats_without_a_marker_load_unverified(tmp_path):
  """Directories written before the marker existed still load."""
  path = _save_stand_in(tmp_path / "ks", 2)
  (path / "complete.json").unlink()
  assert len(key_stats_store.load_key_stats(path)) == 2
