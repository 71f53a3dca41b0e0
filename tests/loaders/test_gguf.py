"""load_gguf on tiny llama.cpp-style files written with gguf.GGUFWriter."""

from __future__ import annotations

import numpy as np
import pytest

from kvq_jax.loaders.gguf import load_gguf
from tests.loaders import tiny_checkpoints as tc


def _expected(weights, name_hf, transpose=True):
  w = tc.stored_value(tc.gguf_name(name_hf), weights[name_hf])
  return w.T if transpose else w


@pytest.mark.parametrize("tied", [True, False])
def test_llama_round_trip(tmp_path, tied):
  weights = tc.random_hf_weights(seed=3, tied=tied)
  path = tmp_path / "tiny.gguf"
  tc.write_gguf(path, weights)
  config, params = load_gguf(path)

  assert (config.vocab_size, config.hidden_size, config.intermediate_size,
          config.num_layers, config.num_heads, config.num_kv_heads,
          config.head_dim) == (tc.V, tc.D, tc.F, tc.L, tc.N, tc.K, tc.H)
  assert config.rope_theta == 50000.0 and config.rope_dim is None
  assert config.rms_norm_eps == 1e-5
  assert config.max_position_embeddings == 128
  assert config.tie_embeddings == tied and not config.attention_bias
  assert (config.bos_token_id, config.eos_token_id) == (1, 2)
  assert ("lm_head" in params) == (not tied)

  # Q/K are stored permuted in F32: un-permutation must be exact.
  for i in range(tc.L):
    layer, pre = params["layers"][i], f"model.layers.{i}"
    for key, proj in (("q", "q_proj"), ("k", "k_proj")):
      assert np.array_equal(layer[key]["kernel"],
                            weights[f"{pre}.self_attn.{proj}.weight"].T)
    for key, proj in (("v", "self_attn.v_proj"), ("o", "self_attn.o_proj"),
                      ("gate", "mlp.gate_proj"), ("up", "mlp.up_proj"),
                      ("down", "mlp.down_proj")):
      np.testing.assert_array_equal(
          layer[key]["kernel"], _expected(weights, f"{pre}.{proj}.weight"))
      assert "bias" not in layer[key]
    np.testing.assert_array_equal(
        layer["attn_norm"], weights[f"{pre}.input_layernorm.weight"])
    np.testing.assert_array_equal(
        layer["mlp_norm"], weights[f"{pre}.post_attention_layernorm.weight"])
  np.testing.assert_array_equal(
      params["embed"], _expected(weights, "model.embed_tokens.weight", False))
  np.testing.assert_array_equal(params["final_norm"],
                                weights["model.norm.weight"])
  if not tied:
    np.testing.assert_array_equal(params["lm_head"],
                                  weights["lm_head.weight"].T)
  # Quantized tensors really went through Q8_0/Q4_0 (lossy but close).
  up = params["layers"][0]["up"]["kernel"]
  assert not np.array_equal(up, weights["model.layers.0.mlp.up_proj.weight"].T)
  np.testing.assert_allclose(
      up, weights["model.layers.0.mlp.up_proj.weight"].T, atol=0.05)
  for leaf in (up, params["embed"], params["layers"][1]["v"]["kernel"]):
    assert leaf.dtype == np.float32 and leaf.flags.c_contiguous


def test_qwen2_biases_and_no_unpermutation(tmp_path):
  weights = tc.random_hf_weights(seed=4, bias=True)
  path = tmp_path / "qwen.gguf"
  tc.write_gguf(path, weights, arch="qwen2", pre="qwen2")
  config, params = load_gguf(path)
  assert config.attention_bias and config.name == "qwen2"
  layer = params["layers"][1]
  for key in ("q", "k", "v"):
    np.testing.assert_array_equal(
        layer[key]["bias"], weights[f"model.layers.1.self_attn.{key}_proj.bias"])
  np.testing.assert_array_equal(
      layer["q"]["kernel"], weights["model.layers.1.self_attn.q_proj.weight"].T)


def test_missing_tensor_names_file_and_tensor(tmp_path):
  path = tmp_path / "missing.gguf"
  tc.write_gguf(path, tc.random_hf_weights(), drop=("blk.1.ffn_up.weight",))
  with pytest.raises(ValueError, match=r"missing\.gguf.*'blk\.1\.ffn_up\.weight'"):
    load_gguf(path)


def test_mismatched_shape_names_tensor(tmp_path):
  path = tmp_path / "shape.gguf"
  tc.write_gguf(path, tc.random_hf_weights(),
                reshape={"blk.0.attn_k.weight": (tc.K * tc.H + 2, tc.D)})
  with pytest.raises(ValueError,
                     match=r"shape\.gguf.*'blk\.0\.attn_k\.weight' has shape"):
    load_gguf(path)


@pytest.mark.parametrize("keep", [0.9, 0.5])
def test_truncated_file_names_file_and_tensor(tmp_path, keep):
  path = tmp_path / "cut.gguf"
  tc.write_gguf(path, tc.random_hf_weights())
  data = path.read_bytes()
  path.write_bytes(data[:int(len(data) * keep)])
  with pytest.raises(ValueError, match=r"cut\.gguf.*truncated.*tensor '"):
    load_gguf(path)


def test_truncated_header_and_garbage(tmp_path):
  path = tmp_path / "head.gguf"
  tc.write_gguf(path, tc.random_hf_weights())
  path.write_bytes(path.read_bytes()[:300])
  with pytest.raises(ValueError, match=r"head\.gguf.*truncated or corrupt"):
    load_gguf(path)
  junk = tmp_path / "junk.gguf"
  junk.write_bytes(b"NOTGGUF" * 20)
  with pytest.raises(ValueError, match=r"junk\.gguf"):
    load_gguf(junk)


def test_nonfinite_values_rejected(tmp_path):
  weights = tc.random_hf_weights()
  weights["model.layers.0.mlp.gate_proj.weight"][3, 4] = np.nan
  path = tmp_path / "nan.gguf"
  tc.write_gguf(path, weights)
  with pytest.raises(ValueError, match=r"'blk\.0\.ffn_gate\.weight'.*non-finite"):
    load_gguf(path)


def test_unsupported_architecture(tmp_path):
  path = tmp_path / "gemma.gguf"
  tc.write_gguf(path, tc.random_hf_weights(), arch="gemma")
  with pytest.raises(ValueError, match="general.architecture='gemma'"):
    load_gguf(path)
