"""load_hf on tiny Hugging Face directories written by the test."""

from __future__ import annotations

import json

import numpy as np
import pytest
import safetensors.numpy

from kvq_jax.loaders import safetensors_io
from kvq_jax.loaders.hf import load_hf
from tests.loaders import tiny_checkpoints as tc

_PROJ = {"q": "self_attn.q_proj", "k": "self_attn.k_proj",
         "v": "self_attn.v_proj", "o": "self_attn.o_proj",
         "gate": "mlp.gate_proj", "up": "mlp.up_proj", "down": "mlp.down_proj"}


def _check_matches(params, weights, cast=lambda w: w):
  for i, layer in enumerate(params["layers"]):
    pre = f"model.layers.{i}"
    for key, proj in _PROJ.items():
      np.testing.assert_array_equal(
          layer[key]["kernel"], cast(weights[f"{pre}.{proj}.weight"]).T)
      if f"{pre}.{proj}.bias" in weights:
        np.testing.assert_array_equal(layer[key]["bias"],
                                      cast(weights[f"{pre}.{proj}.bias"]))
      else:
        assert "bias" not in layer[key]
    np.testing.assert_array_equal(
        layer["attn_norm"], cast(weights[f"{pre}.input_layernorm.weight"]))
    np.testing.assert_array_equal(
        layer["mlp_norm"], cast(weights[f"{pre}.post_attention_layernorm.weight"]))
  np.testing.assert_array_equal(params["embed"],
                                cast(weights["model.embed_tokens.weight"]))
  np.testing.assert_array_equal(params["final_norm"],
                                cast(weights["model.norm.weight"]))


def test_llama_tied(tmp_path):
  weights = tc.random_hf_weights(seed=1)
  tc.write_hf(tmp_path, weights)
  config, params = load_hf(tmp_path)
  assert (config.num_layers, config.num_heads, config.num_kv_heads,
          config.head_dim, config.rope_theta) == (tc.L, tc.N, tc.K, tc.H, 5e4)
  assert config.tie_embeddings and not config.attention_bias
  assert "lm_head" not in params
  _check_matches(params, weights)


def test_llama_untied_lm_head_sharded(tmp_path):
  weights = tc.random_hf_weights(seed=2, tied=False)
  tc.write_hf(tmp_path, weights, tied=False, shards=3)
  assert len(list(tmp_path.glob("*.safetensors"))) == 3
  config, params = load_hf(tmp_path)
  assert not config.tie_embeddings
  np.testing.assert_array_equal(params["lm_head"], weights["lm_head.weight"].T)
  _check_matches(params, weights)


def test_qwen2_biases_bf16(tmp_path):
  weights = tc.random_hf_weights(seed=5, bias=True)
  tc.write_hf(tmp_path, weights, model_type="qwen2", dtype=tc.BF16)
  config, params = load_hf(tmp_path)
  assert config.attention_bias and config.name == "qwen2"
  _check_matches(params, weights,
                 cast=lambda w: w.astype(tc.BF16).astype(np.float32))
  assert params["layers"][0]["q"]["bias"].dtype == np.float32


def test_raw_reader_matches_library(tmp_path):
  rng = np.random.default_rng(0)
  arrays = {"a": rng.standard_normal((3, 5)).astype(tc.BF16),
            "b": rng.standard_normal((4,)).astype(np.float16),
            "c": rng.standard_normal((2, 2)).astype(np.float32)}
  path = tmp_path / "x.safetensors"
  safetensors.numpy.save_file(arrays, str(path))
  for name, array in arrays.items():
    raw = safetensors_io.read_raw_tensor(path, name)
    assert raw.dtype == array.dtype
    np.testing.assert_array_equal(raw, array)
  with pytest.raises(ValueError, match=r"x\.safetensors.*'zz' is missing"):
    safetensors_io.read_raw_tensor(path, "zz")
  data = path.read_bytes()
  header = json.loads(data[8:8 + int.from_bytes(data[:8], "little")])
  last = max(arrays, key=lambda n: header[n]["data_offsets"][1])
  path.write_bytes(data[:-2])
  with pytest.raises(ValueError, match=f"'{last}' is truncated"):
    safetensors_io.read_raw_tensor(path, last)


def test_missing_tensor_and_shape_mismatch(tmp_path):
  weights = tc.random_hf_weights()
  del weights["model.layers.1.mlp.up_proj.weight"]
  tc.write_hf(tmp_path / "a", weights)
  with pytest.raises(ValueError, match=r"'model\.layers\.1\.mlp\.up_proj\.weight'"
                     r" is missing"):
    load_hf(tmp_path / "a")
  weights = tc.random_hf_weights()
  weights["model.layers.0.self_attn.k_proj.weight"] = np.zeros((3, tc.D),
                                                                np.float32)
  tc.write_hf(tmp_path / "b", weights)
  with pytest.raises(ValueError, match=r"model\.safetensors.*k_proj\.weight' "
                     r"has shape \(3, 32\)"):
    load_hf(tmp_path / "b")


@pytest.mark.parametrize("extra,match", [
    ({"model_type": "gpt2"}, "model_type='gpt2'"),
    ({"rope_scaling": {"type": "linear", "factor": 2.0}}, "rope_scaling"),
    ({"attention_bias": True}, "attention_bias=True"),
])
def test_unsupported_configs(tmp_path, extra, match):
  tc.write_hf(tmp_path, tc.random_hf_weights(), extra_config=extra)
  with pytest.raises(ValueError, match=match):
    load_hf(tmp_path)


def test_not_a_checkpoint_dir(tmp_path):
  with pytest.raises(ValueError, match="no config.json"):
    load_hf(tmp_path)
  (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
  with pytest.raises(ValueError, match="required key 'num_attention_heads'"):
    load_hf(tmp_path)
