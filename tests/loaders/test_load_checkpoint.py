"""load_checkpoint dispatches on .gguf file vs Hugging Face directory."""

from __future__ import annotations

import numpy as np
import pytest

from kvq_jax import loaders
from tests.loaders import tiny_checkpoints as tc


def test_gguf_and_hf_agree(tmp_path):
  weights = tc.random_hf_weights(seed=9)
  # Keep every GGUF tensor lossless for this comparison.
  for name in list(tc.QUANTIZED):
    weights_name = next(k for k in weights if tc.gguf_name(k) == name)
    weights[weights_name] = tc.stored_value(name, weights[weights_name])
  tc.write_gguf(tmp_path / "m.gguf", weights)
  tc.write_hf(tmp_path / "hf", weights)
  cfg_g, params_g, tok_g = loaders.load_checkpoint(tmp_path / "m.gguf")
  cfg_h, params_h, tok_h = loaders.load_checkpoint(str(tmp_path / "hf"))
  assert tok_g is not None and tok_h is None
  assert cfg_g.num_layers == cfg_h.num_layers == tc.L
  for i in range(tc.L):
    for key in ("q", "k", "v", "o", "gate", "up", "down"):
      np.testing.assert_array_equal(params_g["layers"][i][key]["kernel"],
                                    params_h["layers"][i][key]["kernel"])
  np.testing.assert_array_equal(params_g["embed"], params_h["embed"])


def test_rejects_other_paths(tmp_path):
  (tmp_path / "model.bin").write_bytes(b"x")
  for bad in (tmp_path / "model.bin", tmp_path, tmp_path / "absent.gguf"):
    with pytest.raises(ValueError, match="expected an existing .gguf file"):
      loaders.load_checkpoint(bad)
