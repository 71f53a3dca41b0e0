"""load_gguf on tiny llama.cpp-style files written with gguf.GGUFWriter."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from kvq_jax import assets
from kvq_jax import loaders
from kvq_jax.loaders import param_layout
from kvq_jax.loaders.gguf import load_gguf
from kvq_jax.loaders.hf import load_hf
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


# ------------------------------------------------------------------ gemma3
# Tiny Gemma 3: 7 layers, so llama.cpp's fixed pattern makes layer 5 global.
G_LAYERS, G_N, G_K, G_H, G_W = 7, 2, 1, 32, 8
# HF Gemma3ForCausalLM name piece -> GGUF name piece (convert_hf_to_gguf).
_GEMMA3_GGUF_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "pre_feedforward_layernorm.weight": "ffn_norm.weight",
    "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def _gemma3_hf_weights(seed: int = 0) -> dict[str, np.ndarray]:
  """Gemma3ForCausalLM-named float32 weights; norms hold HF's w (not 1 + w)."""
  rng = np.random.default_rng(seed)
  r = lambda *shape: (0.3 * rng.standard_normal(shape)).astype(np.float32)  # noqa: E731
  d, f, v, q, kv = tc.D, tc.F, tc.V, G_N * G_H, G_K * G_H
  w = {"model.embed_tokens.weight": r(v, d), "model.norm.weight": r(d)}
  shapes = {"input_layernorm.weight": (d,),
            "post_attention_layernorm.weight": (d,),
            "pre_feedforward_layernorm.weight": (d,),
            "post_feedforward_layernorm.weight": (d,),
            "self_attn.q_norm.weight": (G_H,), "self_attn.k_norm.weight": (G_H,),
            "self_attn.q_proj.weight": (q, d), "self_attn.k_proj.weight": (kv, d),
            "self_attn.v_proj.weight": (kv, d), "self_attn.o_proj.weight": (d, q),
            "mlp.gate_proj.weight": (f, d), "mlp.up_proj.weight": (f, d),
            "mlp.down_proj.weight": (d, f)}
  for i in range(G_LAYERS):
    for name, shape in shapes.items():
      w[f"model.layers.{i}.{name}"] = r(*shape)
  return w


def _gemma3_gguf_name(hf_name: str) -> str:
  if hf_name == "model.embed_tokens.weight":
    return "token_embd.weight"
  if hf_name == "model.norm.weight":
    return "output_norm.weight"
  _, _, i, rest = hf_name.split(".", 3)
  return f"blk.{i}.{_GEMMA3_GGUF_NAMES[rest]}"


def _write_gemma3_gguf(path, weights, *, window=G_W, extra=None) -> None:
  """As convert_hf_to_gguf writes Gemma 3: 1 added to every norm weight,
  Q/K rows as in HF (no rope permutation), no output.weight (tied)."""
  writer = gguf.GGUFWriter(str(path), "gemma3")
  writer.add_block_count(G_LAYERS)
  writer.add_context_length(128)
  writer.add_embedding_length(tc.D)
  writer.add_feed_forward_length(tc.F)
  writer.add_head_count(G_N)
  writer.add_head_count_kv(G_K)
  writer.add_key_length(G_H)
  writer.add_value_length(G_H)
  writer.add_rope_freq_base(1e6)
  writer.add_layer_norm_rms_eps(1e-6)
  if window is not None:
    writer.add_sliding_window(window)
  for add in (extra or []):
    add(writer)
  tokens, merges, types = tc.tiny_vocab()
  writer.add_tokenizer_model("gpt2")
  writer.add_tokenizer_pre("smollm")
  writer.add_token_list(tokens)
  writer.add_token_merges(merges)
  writer.add_token_types(types)
  writer.add_bos_token_id(1)
  writer.add_eos_token_id(2)
  for hf_name, w in weights.items():
    if hf_name.endswith("norm.weight"):
      w = w + np.float32(1.0)
    writer.add_tensor(_gemma3_gguf_name(hf_name), w)
  writer.write_header_to_file()
  writer.write_kv_data_to_file()
  writer.write_tensors_to_file()
  writer.close()


def test_gemma3_config_and_params(tmp_path):
  weights = _gemma3_hf_weights(seed=1)
  path = tmp_path / "gemma.gguf"
  _write_gemma3_gguf(path, weights)
  config, params = load_gguf(path)
  assert config.name == "gemma3"
  assert (config.num_layers, config.num_heads, config.num_kv_heads,
          config.head_dim, config.hidden_size) == (G_LAYERS, G_N, G_K, G_H,
                                                   tc.D)
  assert config.local_layers == (0, 1, 2, 3, 4, 6)
  assert config.sliding_window == G_W
  assert [config.layer_window(i) for i in (4, 5, 6)] == [G_W, None, G_W]
  assert (config.rope_theta, config.rope_local_theta) == (1e6, 1e4)
  assert config.query_pre_attn_scalar == G_H
  assert config.final_logit_softcapping is None
  assert config.tie_embeddings and not config.attention_bias
  assert config.rms_norm_eps == 1e-6 and "lm_head" not in params
  layer, pre = params["layers"][3], "model.layers.3"
  # Q/K are not rope-permuted for gemma3: taken exactly as HF has them.
  for key in ("q", "k", "v", "o"):
    np.testing.assert_array_equal(
        layer[key]["kernel"], weights[f"{pre}.self_attn.{key}_proj.weight"].T)
  # Norm weights are used as stored, i.e. HF's w plus the converter's 1.
  for key, hf in (("attn_norm", "input_layernorm"),
                  ("post_attn_norm", "post_attention_layernorm"),
                  ("mlp_norm", "pre_feedforward_layernorm"),
                  ("post_mlp_norm", "post_feedforward_layernorm"),
                  ("q_norm", "self_attn.q_norm"),
                  ("k_norm", "self_attn.k_norm")):
    np.testing.assert_array_equal(layer[key],
                                  weights[f"{pre}.{hf}.weight"] + 1)
  np.testing.assert_array_equal(params["final_norm"],
                                weights["model.norm.weight"] + 1)


def test_gemma3_optional_metadata(tmp_path):
  weights = _gemma3_hf_weights(seed=2)
  path = tmp_path / "opt.gguf"
  _write_gemma3_gguf(path, weights, extra=[
      lambda w: w.add_rope_freq_base_swa(77.0),
      lambda w: w.add_final_logit_softcapping(30.0)])
  config, _ = load_gguf(path)
  assert config.rope_local_theta == 77.0
  assert config.final_logit_softcapping == 30.0
  _write_gemma3_gguf(path, weights, window=None)
  config, _ = load_gguf(path)  # llama.cpp: no window key -> all global.
  assert config.local_layers == () and config.sliding_window is None
  _write_gemma3_gguf(path, weights, extra=[
      lambda w: w.add_attn_logit_softcapping(50.0)])
  with pytest.raises(ValueError, match="attn_logit_softcapping=50.0"):
    load_gguf(path)


def test_gemma3_hf_directory_loads_the_same(tmp_path):
  weights = _gemma3_hf_weights(seed=3)
  _write_gemma3_gguf(tmp_path / "g.gguf", weights)
  tc.write_hf(tmp_path / "hf", weights, model_type="gemma3_text", extra_config={
      "num_hidden_layers": G_LAYERS, "num_attention_heads": G_N,
      "num_key_value_heads": G_K, "head_dim": G_H, "rope_theta": 1e6,
      "rms_norm_eps": 1e-6, "sliding_window": G_W,
      "query_pre_attn_scalar": G_H, "hidden_act": "gelu_pytorch_tanh",
      "hidden_activation": "gelu_pytorch_tanh"})
  gguf_config, gguf_params = load_gguf(tmp_path / "g.gguf")
  hf_config, hf_params = load_hf(tmp_path / "hf")
  assert hf_config == gguf_config
  flat_gguf, flat_hf = param_layout.flatten(gguf_params), param_layout.flatten(hf_params)
  assert flat_gguf.keys() == flat_hf.keys()
  for key, value in flat_gguf.items():
    np.testing.assert_array_equal(flat_hf[key], value, err_msg=key)


def test_gemma3_param_cache_round_trip(tmp_path, monkeypatch):
  """The orbax cache restores the gemma3 fields (local_layers a tuple)."""
  monkeypatch.setenv("KVQ_JAX_CACHE", str(tmp_path / "cache"))
  source = tmp_path / "gemma.gguf"
  _write_gemma3_gguf(source, _gemma3_hf_weights(seed=4), extra=[
      lambda w: w.add_final_logit_softcapping(30.0)])
  calls = []
  real = loaders.load_checkpoint
  monkeypatch.setattr(loaders, "load_checkpoint",
                      lambda p: calls.append(p) or real(p))
  config, params, _ = assets.load_params_cached(str(source))
  restored, params2, _ = assets.load_params_cached(str(source))
  assert len(calls) == 1  # The second load restored the entry.
  assert restored == config and isinstance(restored.local_layers, tuple)
  assert hash(restored) == hash(config)
  assert restored.final_logit_softcapping == 30.0
  flat, flat2 = param_layout.flatten(params), param_layout.flatten(params2)
  assert flat.keys() == flat2.keys() and "layers/6/k_norm" in flat
  for key, value in flat.items():
    np.testing.assert_array_equal(flat2[key], value, err_msg=key)
