"""Decoder forward: numpy reference, cache consistency, params round trip."""

from __future__ import annotations

import jax
import numpy as np
import jax.numpy as jnp
import pytest

from kvq_jax.models.params import (decoder_from_params, param_shapes,
                                   params_dict, random_params)
from kvq_jax.models.runtime import Runtime

from tests.models.tiny import TINY


def reference_logits(config, params, tokens):
  """Independent float64 numpy forward pass of one sequence [T] -> [T, V]."""
  p = {k: v for k, v in params.items()}
  n, k, h = config.num_heads, config.num_kv_heads, config.head_dim
  r = config.rotary_dim
  t = len(tokens)

  def rms(x, w):
    return x / np.sqrt(np.mean(x * x, -1, keepdims=True)
                       + config.rms_norm_eps) * w

  def proj(x, d):
    return x @ d["kernel"] + (d["bias"] if "bias" in d else 0.0)

  def rope(x):  # x [T, heads, h]; pairs (i, i + r/2).
    freq = config.rope_theta ** (-np.arange(0, r, 2) / r)
    ang = np.arange(t)[:, None, None] * freq  # [T, 1, r/2]
    x1, x2, rest = x[..., :r // 2], x[..., r // 2:r], x[..., r:]
    return np.concatenate([x1 * np.cos(ang) - x2 * np.sin(ang),
                           x2 * np.cos(ang) + x1 * np.sin(ang), rest], -1)

  x = p["embed"].astype(np.float64)[tokens]
  causal = np.tril(np.ones((t, t), bool))
  for layer in p["layers"]:
    y = rms(x, layer["attn_norm"])
    q = rope(proj(y, layer["q"]).reshape(t, n, h))
    kk = np.repeat(rope(proj(y, layer["k"]).reshape(t, k, h)), n // k, 1)
    v = np.repeat(proj(y, layer["v"]).reshape(t, k, h), n // k, 1)
    s = np.einsum("qnh,knh->nqk", q, kk) / np.sqrt(h)
    s = np.where(causal, s, -np.inf)
    a = np.exp(s - s.max(-1, keepdims=True))
    a /= a.sum(-1, keepdims=True)
    x = x + proj(np.einsum("nqk,knh->qnh", a, v).reshape(t, n * h), layer["o"])
    y = rms(x, layer["mlp_norm"])
    g = proj(y, layer["gate"])
    x = x + proj(g / (1 + np.exp(-g)) * proj(y, layer["up"]), layer["down"])
  x = rms(x, p["final_norm"])
  head = p["embed"].T if config.tie_embeddings else p["lm_head"]
  return x @ head


def _tokens(b, t, seed=0, vocab=97):
  return jnp.asarray(np.random.default_rng(seed).integers(0, vocab, (b, t)),
                     jnp.int32)


def _full_forward(model, tokens):
  """Jitted one-chunk forward from an empty cache of capacity T."""
  b, t = tokens.shape
  logits, _ = Runtime(model).prefill(tokens, model.init_cache(b, t))
  return np.asarray(logits)


def test_logits_match_numpy_reference(config, params, model):
  tokens = _tokens(2, 9, seed=1)
  logits = _full_forward(model, tokens)
  assert logits.shape == (2, 9, config.vocab_size)
  assert logits.dtype == np.float32
  for b in range(2):
    ref = reference_logits(config, params, np.asarray(tokens[b]))
    assert np.abs(ref).max() > 0.1  # Non-trivial logits.
    np.testing.assert_allclose(logits[b], ref, atol=2e-5, rtol=1e-4)


def test_prefill_equals_token_by_token_decode(config, model):
  tokens = _tokens(2, 8, seed=2)
  runtime = Runtime(model)
  full, _ = runtime.prefill(tokens, runtime.init_cache(2, 12))
  cache = runtime.init_cache(2, 12)
  steps = []
  for i in range(8):
    logits, cache = runtime.decode(tokens[:, i], cache)
    steps.append(np.asarray(logits))
  np.testing.assert_array_equal(np.asarray(cache[0].length_B), [8, 8])
  np.testing.assert_allclose(np.stack(steps, 1), np.asarray(full), atol=1e-5)


def test_prefill_in_two_chunks_equals_one(config, model):
  tokens = _tokens(2, 10, seed=3)
  runtime = Runtime(model)
  full, _ = runtime.prefill(tokens, runtime.init_cache(2, 10))
  cache = runtime.init_cache(2, 10)
  first, cache = runtime.prefill(tokens[:, :6], cache)
  second, cache = runtime.prefill(tokens[:, 6:], cache)
  np.testing.assert_allclose(
      np.concatenate([np.asarray(first), np.asarray(second)], 1),
      np.asarray(full), atol=1e-5)


def test_ragged_lengths_with_explicit_positions(tiny_model):
  """Sequence 1 starts one token later; its logits equal a solo run."""
  tokens = _tokens(2, 6, seed=4)
  runtime = Runtime(tiny_model)
  cache = runtime.init_cache(2, 8)
  _, cache = runtime.prefill(tokens[:, :1], cache)
  cache = [c.replace(length_B=jnp.asarray([1, 0], jnp.int32)) for c in cache]
  positions = jnp.asarray([[1, 2, 3], [0, 1, 2]])
  out, cache = runtime.prefill(
      jnp.stack([tokens[0, 1:4], tokens[1, :3]]), cache, positions)
  solo0 = _full_forward(tiny_model, tokens[:1, :4])[0, 1:4]
  solo1 = _full_forward(tiny_model, tokens[1:, :3])[0]
  np.testing.assert_allclose(np.asarray(out[0]), solo0, atol=1e-5)
  np.testing.assert_allclose(np.asarray(out[1]), solo1, atol=1e-5)
  np.testing.assert_array_equal(np.asarray(cache[0].length_B), [4, 3])


def test_capacity_overflow_raises(tiny_model):
  runtime = Runtime(tiny_model)
  cache = runtime.init_cache(1, 4)
  _, cache = runtime.prefill(_tokens(1, 3), cache)
  _, cache = runtime.decode(jnp.asarray([1]), cache)
  with pytest.raises(ValueError, match="capacity 4"):
    runtime.decode(jnp.asarray([1]), cache)
  with pytest.raises(ValueError, match="overflow"):
    runtime.prefill(_tokens(1, 5), runtime.init_cache(1, 4))


@pytest.mark.parametrize("cache_dtype", [jnp.bfloat16, jnp.float16])
def test_low_precision_cache_stays_close(tiny_model, cache_dtype):
  tokens = _tokens(1, 12, seed=6)
  runtime = Runtime(tiny_model)
  ref, _ = runtime.prefill(tokens, runtime.init_cache(1, 12))
  cache = runtime.init_cache(1, 12, cache_dtype)
  assert cache[0].dtype == cache_dtype
  low, _ = runtime.prefill(tokens[:, :8], cache)
  ref, low = np.asarray(ref)[:, :8], np.asarray(low)
  assert not np.array_equal(low, ref)  # The rounding is really applied.
  np.testing.assert_allclose(low, ref, atol=2e-2 * np.abs(ref).max())


def test_bf16_compute_runs_and_stays_close(config, params):
  model32 = decoder_from_params(config, params)
  model16 = decoder_from_params(config, params, dtype=jnp.bfloat16)
  tokens = _tokens(1, 6, seed=7)
  ref, low = _full_forward(model32, tokens), _full_forward(model16, tokens)
  assert low.dtype == np.float32
  np.testing.assert_allclose(low, ref, atol=5e-2 * np.abs(ref).max())


def test_params_round_trip(config, params, model):
  back = params_dict(model)
  assert back.keys() == params.keys()
  for name in ("embed", "final_norm"):
    np.testing.assert_array_equal(back[name], params[name])
  for got, want in zip(back["layers"], params["layers"]):
    assert got.keys() == want.keys()
    for key in want:
      if isinstance(want[key], dict):
        assert got[key].keys() == want[key].keys()
        for sub in want[key]:
          np.testing.assert_array_equal(got[key][sub], want[key][sub])
      else:
        np.testing.assert_array_equal(got[key], want[key])


def test_load_params_rejects_bad_shapes_and_missing_entries():
  params = random_params(TINY)
  params["layers"][1]["q"]["kernel"] = np.zeros((64, 8), np.float32)
  with pytest.raises(ValueError, match=r"layers\.1\.q\.kernel.*\(64, 8\)"):
    decoder_from_params(TINY, params)
  params = random_params(TINY)
  del params["layers"][0]["up"]
  with pytest.raises(ValueError, match=r"layers\.0\.up"):
    decoder_from_params(TINY, params)
  params = random_params(TINY)
  params["layers"].pop()
  with pytest.raises(ValueError, match="num_layers"):
    decoder_from_params(TINY, params)


def test_param_shapes_layout_for_untied_biased_config(config):
  shapes = param_shapes(config)
  assert ("lm_head" in shapes) == (not config.tie_embeddings)
  assert ("bias" in shapes["layers"][0]["k"]) == config.attention_bias
  assert shapes["layers"][0]["k"]["kernel"] == (64, 32)
  assert "bias" not in shapes["layers"][0]["o"]


def test_consume_frees_the_loader_leaves_and_loads_the_same_weights():
  params = random_params(TINY, seed=4)
  kept = decoder_from_params(TINY, params)
  consumed_tree = random_params(TINY, seed=4)
  consumed = decoder_from_params(TINY, consumed_tree, consume=True)
  assert all(leaf is None for leaf in jax.tree_util.tree_leaves(
      consumed_tree, is_leaf=lambda x: x is None))
  ids = jnp.asarray([[1, 2, 3]], jnp.int32)
  pos = jnp.arange(3, dtype=jnp.int32)[None]
  np.testing.assert_array_equal(
      np.asarray(kept(ids, pos, kept.init_cache(1, 3))[0]),
      np.asarray(consumed(ids, pos, consumed.init_cache(1, 3))[0]))
