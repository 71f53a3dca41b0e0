"""load_params_cached: converts once, then restores the orbax copy."""

from __future__ import annotations

import json
import logging
import os

import numpy as np
import pytest

from kvq_jax import assets
from kvq_jax import loaders
from kvq_jax.assets import entry_marker
from kvq_jax.assets import param_cache
from kvq_jax.loaders import param_layout
from tests.loaders import tiny_checkpoints as tc


def _counted_source(tmp_path, monkeypatch, seed: int):
  """A tiny GGUF under a temporary cache root, and the list every
  conversion of it appends to."""
  monkeypatch.setenv("KVQ_JAX_CACHE", str(tmp_path / "cache"))
  source = tmp_path / "tiny.gguf"
  tc.write_gguf(source, tc.random_hf_weights(seed=seed, tied=False))
  calls = []
  real = loaders.load_checkpoint
  monkeypatch.setattr(loaders, "load_checkpoint",
                      lambda p: calls.append(p) or real(p))
  return source, calls


def test_second_load_skips_conversion(tmp_path, monkeypatch):
  source, calls = _counted_source(tmp_path, monkeypatch, seed=7)

  config, params, tok = assets.load_params_cached(str(source))
  config2, params2, tok2 = assets.load_params_cached(str(source))
  assert len(calls) == 1
  assert config2 == config
  flat, flat2 = param_layout.flatten(params), param_layout.flatten(params2)
  assert flat.keys() == flat2.keys() and "lm_head" in flat
  for key, value in flat.items():
    assert isinstance(flat2[key], np.ndarray) and flat2[key].dtype == np.float32
    np.testing.assert_array_equal(flat2[key], value)
  assert isinstance(params2["layers"], list)
  assert tok2.encode("hello <|im_end|>") == tok.encode("hello <|im_end|>")
  assert tok2.chat_template == tok.chat_template

  entries = list((tmp_path / "cache" / "params").iterdir())
  assert [e.name for e in entries] == [param_cache.entry_dir(source).name]
  assert (entries[0] / "config.json").is_file()

  # Rewriting the source (new mtime) invalidates the key.
  stat = source.stat()
  os.utime(source, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
  assets.load_params_cached(source)
  assert len(calls) == 2


def test_corrupt_entry_is_rebuilt(tmp_path, monkeypatch):
  monkeypatch.setenv("KVQ_JAX_CACHE", str(tmp_path / "cache"))
  source = tmp_path / "hf"
  tc.write_hf(source, tc.random_hf_weights(seed=8))
  _, params, tok = assets.load_params_cached(source)
  assert tok is None  # No tokenizer.json in this directory.
  entry = param_cache.entry_dir(source)
  (entry / "config.json").write_text("{not json")
  _, params2, _ = assets.load_params_cached(source)
  np.testing.assert_array_equal(params2["embed"], params["embed"])
  assert (entry / "config.json").read_text().startswith("{\n")


def test_unknown_name(tmp_path, monkeypatch):
  monkeypatch.setenv("KVQ_JAX_CACHE", str(tmp_path))
  with pytest.raises(ValueError, match="neither a registered name"):
    assets.load_params_cached("no-such-model")


def _biggest_file(directory):
  return max((p for p in directory.rglob("*") if p.is_file()),
             key=lambda p: p.stat().st_size)


def _truncate(path):
  path.write_bytes(path.read_bytes()[:path.stat().st_size // 2])


def _flip_a_byte(path):
  """A write that changes one byte; its mtime moves (set explicitly: two
  writes within one file-system clock tick can share an mtime)."""
  mtime = path.stat().st_mtime_ns
  data = bytearray(path.read_bytes())
  data[len(data) // 2] ^= 0xFF
  path.write_bytes(bytes(data))
  os.utime(path, ns=(mtime, mtime + 10**9))


@pytest.mark.parametrize("damage", [
    lambda entry: _truncate(_biggest_file(entry / "params")),
    lambda entry: _flip_a_byte(_biggest_file(entry / "params")),
    lambda entry: _biggest_file(entry / "params").unlink(),
    lambda entry: (entry / "tokenizer" / "tokenizer.json").unlink(),
    lambda entry: (entry / "complete.json").write_text('{"files": '),
], ids=["truncated", "byte_flipped", "file_deleted", "tokenizer_deleted",
        "marker_truncated"])
def test_damaged_entry_is_rebuilt_with_a_warning(tmp_path, monkeypatch, caplog,
                                                 damage):
  source, calls = _counted_source(tmp_path, monkeypatch, seed=9)
  _, params, tok = assets.load_params_cached(source)
  entry = param_cache.entry_dir(source)
  damage(entry)

  with caplog.at_level(logging.WARNING):
    _, params2, tok2 = assets.load_params_cached(source)
  assert len(calls) == 2  # Converted again.
  warnings = [r.getMessage() for r in caplog.records
              if r.levelno == logging.WARNING]
  assert len(warnings) == 1
  assert f"Param cache entry {entry} is unusable" in warnings[0]
  assert f"converting {source} again" in warnings[0]
  for key, value in param_layout.flatten(params).items():
    np.testing.assert_array_equal(param_layout.flatten(params2)[key], value)
  assert tok2.encode("hello world") == tok.encode("hello world")

  caplog.clear()
  with caplog.at_level(logging.WARNING):
    assets.load_params_cached(source)  # The rebuilt entry is trusted.
  assert len(calls) == 2 and not caplog.records
  assert [p.name for p in entry.parent.iterdir()] == [entry.name]


def test_entry_from_before_the_marker_is_adopted(tmp_path, monkeypatch,
                                                 caplog):
  """An intact entry written before complete.json existed is not rebuilt; a
  damaged one is."""
  source, calls = _counted_source(tmp_path, monkeypatch, seed=10)
  _, params, _ = assets.load_params_cached(source)
  entry = param_cache.entry_dir(source)
  marker = (entry / "complete.json").read_text()
  (entry / "complete.json").unlink()

  with caplog.at_level(logging.WARNING):
    _, params2, _ = assets.load_params_cached(source)
  assert len(calls) == 1 and not caplog.records
  np.testing.assert_array_equal(params2["embed"], params["embed"])
  assert (entry / "complete.json").read_text() == marker

  (entry / "complete.json").unlink()
  _truncate(_biggest_file(entry / "params"))
  with caplog.at_level(logging.WARNING):
    assets.load_params_cached(source)
  assert len(calls) == 2
  assert any(f"{entry} is unusable (restoring it failed" in r.getMessage()
             for r in caplog.records)


def test_leftovers_of_killed_writers_are_swept(tmp_path, monkeypatch):
  monkeypatch.setenv("KVQ_JAX_CACHE", str(tmp_path / "cache"))
  source = tmp_path / "tiny.gguf"
  tc.write_gguf(source, tc.random_hf_weights(seed=12, tied=False))
  entry = param_cache.entry_dir(source)
  other = entry.with_name("other-0123")
  for leftover in (entry.with_name(f".{entry.name}.tmp-dead"),
                   entry.with_name(f".{entry.name}.trash-99"), other):
    (leftover / "params").mkdir(parents=True)
  assets.load_params_cached(source)
  assert sorted(p.name for p in entry.parent.iterdir()) == sorted(
      [entry.name, other.name])  # Another entry's folder is not touched.


def test_unchanged_files_are_not_read_again_for_checksums(tmp_path,
                                                          monkeypatch):
  """A marker row whose size and mtime match is trusted (no crc32 pass);
  an older marker's [size, crc32] rows are checked once, then given their
  mtimes."""
  monkeypatch.setenv("KVQ_JAX_CACHE", str(tmp_path / "cache"))
  source = tmp_path / "tiny.gguf"
  tc.write_gguf(source, tc.random_hf_weights(seed=11, tied=False))
  assets.load_params_cached(source)
  entry = param_cache.entry_dir(source)
  marker = entry / param_cache.MARKER
  rows = json.loads(marker.read_text())["files"]
  assert rows and all(len(row) == 3 for row in rows.values())

  crcs = []
  real_crc = entry_marker.zlib.crc32
  monkeypatch.setattr(entry_marker.zlib, "crc32",
                      lambda *a: crcs.append(1) or real_crc(*a))
  assets.load_params_cached(source)
  assert not crcs
  old = {"marker_version": 1,
         "files": {name: row[:2] for name, row in rows.items()}}
  marker.write_text(json.dumps(old))
  assets.load_params_cached(source)
  assert crcs  # Checked...
  assert json.loads(marker.read_text())["files"] == rows  # ...and upgraded.
  crcs.clear()
  assets.load_params_cached(source)
  assert not crcs
