"""Gemma3Decoder on tiny random configs against a hand-written numpy forward.

The reference below is written from transformers' modeling_gemma3.py, not
from the module: Gemma3RMSNorm x_hat * (1 + w) with w = stored - 1 (the
layout holds 1 + w), sandwich norms, q/k norms before RoPE, GeGLU with the
tanh GELU, sqrt(D) embedding scale, 1/sqrt(query_pre_attn_scalar), the band
mask i - W < j <= i on local layers with their own RoPE base, soft-capping.
"""

from __future__ import annotations

import dataclasses
import json

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from kvq_jax.cache.dense import DenseLayerCache
from kvq_jax.models.config import ModelConfig
from kvq_jax.models.decoder import Decoder
from kvq_jax.models.gemma3 import Gemma3Block, Gemma3Decoder
from kvq_jax.models.params import (decoder_class, decoder_from_params,
                                   load_params, params_dict, random_params)
from kvq_jax.models.runtime import Runtime

from tests.models.tiny import TINY

W = 4  # Sliding window of the tiny configs' local layers.
# Gemma 3 proper: query scale 1/sqrt(head_dim), no soft-capping.
TINY_GEMMA3 = ModelConfig(
    vocab_size=97, hidden_size=64, intermediate_size=128, num_layers=3,
    num_heads=4, num_kv_heads=2, head_dim=16, rope_theta=10000.0,
    rms_norm_eps=1e-6, name="gemma3", sliding_window=W, local_layers=(0, 1),
    rope_local_theta=50.0, query_pre_attn_scalar=16.0)
# Every option off its default: MQA, query_pre_attn_scalar != head_dim,
# final-logit soft-capping, a global layer first.
TINY_GEMMA3_SCALED = dataclasses.replace(
    TINY_GEMMA3, num_kv_heads=1, query_pre_attn_scalar=24.0,
    final_logit_softcapping=3.0, local_layers=(1, 2), rope_theta=300.0)


@pytest.fixture(scope="module", params=["gemma3", "scaled_capped"],
                name="config")
def _config(request) -> ModelConfig:
  return TINY_GEMMA3 if request.param == "gemma3" else TINY_GEMMA3_SCALED


@pytest.fixture(scope="module", name="params")
def _params(config):
  return random_params(config, seed=11, scale=0.15)


@pytest.fixture(scope="module", name="model")
def _model(config, params):
  return decoder_from_params(config, params)


# ----------------------------------------------------------------- reference


def _gemma_rms(x, stored, eps):
  w = stored.astype(np.float64) - 1.0  # HF's Gemma3RMSNorm weight.
  return x / np.sqrt(np.mean(x * x, -1, keepdims=True) + eps) * (1.0 + w)


def _gelu_tanh(x):
  return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi)
                                  * (x + 0.044715 * x ** 3)))


def _rope(x, positions, theta):
  """rotate_half RoPE of x [T, heads, H] at integer positions [T]."""
  h = x.shape[-1]
  freq = theta ** (-np.arange(0, h, 2) / h)
  ang = np.asarray(positions, np.float64)[:, None, None] * freq
  x1, x2 = x[..., :h // 2], x[..., h // 2:]
  return np.concatenate([x1 * np.cos(ang) - x2 * np.sin(ang),
                         x2 * np.cos(ang) + x1 * np.sin(ang)], -1)


def reference_block(config, layer, index, x):
  """One Gemma 3 decoder layer on x [T, D] (positions 0..T-1), float64."""
  t = x.shape[0]
  n, k, h = config.num_heads, config.num_kv_heads, config.head_dim
  eps = config.rms_norm_eps
  local = index in config.local_layers
  theta = config.rope_local_theta if local else config.rope_theta
  w = lambda key: layer[key]["kernel"].astype(np.float64)  # noqa: E731

  y = _gemma_rms(x, layer["attn_norm"], eps)
  q = _gemma_rms((y @ w("q")).reshape(t, n, h), layer["q_norm"], eps)
  kk = _gemma_rms((y @ w("k")).reshape(t, k, h), layer["k_norm"], eps)
  v = (y @ w("v")).reshape(t, k, h)
  q, kk = _rope(q, np.arange(t), theta), _rope(kk, np.arange(t), theta)
  kk, v = np.repeat(kk, n // k, 1), np.repeat(v, n // k, 1)
  scores = np.einsum("qnh,knh->nqk", q, kk) / np.sqrt(
      config.query_pre_attn_scalar)
  i, j = np.arange(t)[:, None], np.arange(t)[None, :]
  visible = (j <= i) & ((j > i - config.sliding_window) if local else True)
  scores = np.where(visible, scores, -np.inf)
  probs = np.exp(scores - scores.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)
  attn = np.einsum("nqk,knh->qnh", probs, v).reshape(t, n * h) @ w("o")
  x = x + _gemma_rms(attn, layer["post_attn_norm"], eps)

  y = _gemma_rms(x, layer["mlp_norm"], eps)
  mlp = (_gelu_tanh(y @ w("gate")) * (y @ w("up"))) @ w("down")
  return x + _gemma_rms(mlp, layer["post_mlp_norm"], eps)


def reference_logits(config, params, tokens):
  """The whole tiny model on one sequence [T] -> logits [T, V], float64."""
  embed = params["embed"].astype(np.float64)
  x = embed[tokens] * np.sqrt(config.hidden_size)
  for index, layer in enumerate(params["layers"]):
    x = reference_block(config, layer, index, x)
  logits = _gemma_rms(x, params["final_norm"], config.rms_norm_eps) @ embed.T
  cap = config.final_logit_softcapping
  return logits if cap is None else cap * np.tanh(logits / cap)


# ---------------------------------------------------------------- utilities


def _tokens(b, t, seed=0):
  return jnp.asarray(np.random.default_rng(seed).integers(0, 97, (b, t)),
                     jnp.int32)


def _has_window_caches(model) -> bool:
  cache = model.init_cache(1, 2 * W)
  return all(getattr(c, "sliding_window", None) == model.config.layer_window(i)
             for i, c in enumerate(cache))


def _full_forward(model, tokens):
  b, t = tokens.shape
  logits, _ = Runtime(model).prefill(tokens, model.init_cache(b, t))
  return np.asarray(logits)


# -------------------------------------------------------------------- tests


def test_forward_shapes_and_layer_setup(config, model):
  assert isinstance(model, Gemma3Decoder) and isinstance(model, Decoder)
  assert model.lm_head is None and model.config is config
  logits, cache = model(_tokens(2, 3), jnp.broadcast_to(jnp.arange(3), (2, 3)),
                        model.init_cache(2, 8))
  assert logits.shape == (2, 3, 97) and logits.dtype == jnp.float32
  assert len(cache) == config.num_layers
  np.testing.assert_array_equal(np.asarray(cache[0].length_B), [3, 3])
  for i, block in enumerate(model.layers):
    assert isinstance(block, Gemma3Block)
    local = i in config.local_layers
    assert block.attn.rope.theta == (config.rope_local_theta if local
                                     else config.rope_theta)
    assert block.attn.q_norm.weight.shape == (config.head_dim,)
  prescale = model.layers[0].attn.query_prescale
  if config.query_pre_attn_scalar == config.head_dim:
    assert prescale is None
  else:
    assert prescale == pytest.approx(np.sqrt(16 / 24))


def test_one_block_matches_numpy_reference(config, params, model):
  """Block 0 alone (a local layer in one config, a global one in the other),
  T <= W so the cache kind does not matter."""
  rng = np.random.default_rng(5)
  t = W
  x = rng.standard_normal((1, t, config.hidden_size)).astype(np.float32)
  cache = DenseLayerCache.create(1, t, config.num_kv_heads, config.head_dim)
  out, _ = model.layers[0](jnp.asarray(x), jnp.arange(t)[None], cache)
  ref = reference_block(config, params["layers"][0], 0,
                        x[0].astype(np.float64))
  np.testing.assert_allclose(np.asarray(out[0]), ref, atol=2e-5, rtol=1e-4)


def test_logits_match_numpy_reference_within_window(config, params, model):
  tokens = _tokens(2, W, seed=1)
  logits = _full_forward(model, tokens)
  for b in range(2):
    ref = reference_logits(config, params, np.asarray(tokens[b]))
    assert np.abs(ref).max() > 0.5  # Non-trivial logits.
    np.testing.assert_allclose(logits[b], ref, atol=3e-5, rtol=1e-4)


def test_sliding_window_matches_band_reference(config, params, model):
  """T = 3W: local layers must see only i - W < j <= i."""
  if not _has_window_caches(model):
    pytest.skip("cache.factory.init_cache builds no sliding-window caches "
                "yet (ModelConfig.layer_window is not honoured).")
  tokens = _tokens(2, 3 * W, seed=2)
  logits = _full_forward(model, tokens)
  for b in range(2):
    ref = reference_logits(config, params, np.asarray(tokens[b]))
    np.testing.assert_allclose(logits[b], ref, atol=3e-5, rtol=1e-4)
  # The window matters: the same reference without it is far off.
  no_window = reference_logits(
      dataclasses.replace(config, sliding_window=10 ** 4), params,
      np.asarray(tokens[0]))
  assert np.abs(no_window - logits[0]).max() > 1e-2


def test_chunked_prefill_and_decode_equal_one_shot(config, model):
  t = 3 * W + 1
  tokens = _tokens(2, t, seed=3)
  runtime = Runtime(model)
  full, _ = runtime.prefill(tokens, runtime.init_cache(2, t))
  cache = runtime.init_cache(2, t)
  chunks = []
  for start, stop in ((0, 3), (3, W + 3), (W + 3, t)):
    out, cache = runtime.prefill(tokens[:, start:stop], cache)
    chunks.append(np.asarray(out))
  np.testing.assert_allclose(np.concatenate(chunks, 1), np.asarray(full),
                             atol=2e-5)
  cache = runtime.init_cache(2, t)
  steps = []
  for i in range(t):
    logits, cache = runtime.decode(tokens[:, i], cache)
    steps.append(np.asarray(logits))
  np.testing.assert_array_equal(np.asarray(cache[0].length_B), [t, t])
  np.testing.assert_allclose(np.stack(steps, 1), np.asarray(full), atol=2e-5)


def test_params_round_trip(config, params, model):
  out = params_dict(model)
  assert set(out["layers"][0]) == {
      "attn_norm", "q", "k", "v", "o", "q_norm", "k_norm", "post_attn_norm",
      "mlp_norm", "gate", "up", "down", "post_mlp_norm"}
  np.testing.assert_array_equal(out["layers"][1]["k_norm"],
                                params["layers"][1]["k_norm"])
  np.testing.assert_array_equal(out["layers"][2]["post_mlp_norm"],
                                params["layers"][2]["post_mlp_norm"])
  np.testing.assert_array_equal(out["embed"], params["embed"])
  bad = params_dict(model)
  del bad["layers"][0]["q_norm"]
  with pytest.raises(ValueError, match=r"params\['layers\.0\.q_norm'\]"):
    load_params(decoder_from_params(config, params), bad)


def test_bfloat16_forward_is_close(config, params):
  model = decoder_from_params(config, params, dtype=jnp.bfloat16,
                              param_dtype=jnp.bfloat16)
  tokens = _tokens(1, W, seed=4)
  logits = _full_forward(model, tokens)
  assert logits.dtype == np.float32
  ref = reference_logits(config, params, np.asarray(tokens[0]))
  np.testing.assert_allclose(logits[0], ref, atol=0.15)


def test_decoder_class_by_name():
  assert decoder_class(TINY_GEMMA3) is Gemma3Decoder
  assert decoder_class(TINY) is Decoder
  assert type(decoder_from_params(TINY, random_params(TINY))) is Decoder
  with pytest.raises(ValueError, match="Gemma3Decoder: config.name='llama'"):
    Gemma3Decoder(TINY, rngs=nnx.Rngs(0))


def test_config_fields_and_json_round_trip():
  config = TINY_GEMMA3_SCALED
  assert [config.layer_window(i) for i in range(3)] == [None, W, W]
  assert [config.layer_rope_theta(i) for i in range(3)] == [300.0, 50.0, 50.0]
  assert config.query_scale == pytest.approx(24 ** -0.5)
  assert TINY.query_scale == pytest.approx(16 ** -0.5)
  assert TINY.final_logit_softcapping is None and TINY.local_layers == ()
  meta = json.loads(json.dumps(dataclasses.asdict(config)))
  assert isinstance(meta["local_layers"], list)
  restored = ModelConfig.from_dict(meta)
  assert restored == config and hash(restored) == hash(config)


@pytest.mark.parametrize("change,match", [
    ({"name": "gemma2"}, r"name='gemma2'.*allowed"),
    ({"local_layers": [0, 1]}, r"local_layers=\[0, 1\]"),
    ({"local_layers": (3,)}, "local_layers"),
    ({"sliding_window": None}, "sliding_window=None"),
    ({"query_pre_attn_scalar": 0.0}, "query_pre_attn_scalar=0.0"),
    ({"final_logit_softcapping": -1.0}, "final_logit_softcapping=-1.0"),
    ({"rope_local_theta": "1e4"}, "rope_local_theta='1e4'"),
])
def test_config_validation(change, match):
  with pytest.raises(ValueError, match=match):
    dataclasses.replace(TINY_GEMMA3, **change)
