"""load_params_cached: converts once, then restores the orbax copy."""

from __future__ import annotations

import os

import numpy as np
import pytest

from kvq_jax import assets
from kvq_jax import loaders
from kvq_jax.assets import param_cache
from kvq_jax.loaders import param_layout
from tests.loaders import tiny_checkpoints as tc


def test_second_load_skips_conversion(tmp_path, monkeypatch):
  monkeypatch.setenv("KVQ_JAX_CACHE", str(tmp_path / "cache"))
  source = tmp_path / "tiny.gguf"
  tc.write_gguf(source, tc.random_hf_weights(seed=7, tied=False))
  calls = []
  real = loaders.load_checkpoint
  monkeypatch.setattr(loaders, "load_checkpoint",
                      lambda p: calls.append(p) or real(p))

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
