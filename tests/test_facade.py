"""kvq_jax.load_model / forward_logits on a tiny Hugging Face checkpoint."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

import kvq_jax
from kvq_jax import facade
from kvq_jax.cache.factory import init_cache
from kvq_jax.cache.spec import CacheSpec
from kvq_jax.models.runtime import Runtime
from kvq_jax.settings.short_specs import parse_short_spec
from tests.fixtures import tiny_hf_model

IDS = np.array([[5, 17, 42, 3, 9, 0, 63], [1, 2, 3, 4, 5, 6, 7]], np.int32)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
  root = tmp_path_factory.mktemp("facade")
  with pytest.MonkeyPatch.context() as mp:
    mp.setenv("KVQ_JAX_CACHE", str(root / "cache"))
    path = tiny_hf_model.write_tiny_model(root / "model")
    yield {"root": root, "path": path, "model": kvq_jax.load_model(str(path))}


def test_load_model(env):
  model = env["model"]
  assert model.config.vocab_size == tiny_hf_model.V
  assert model.config.head_dim == tiny_hf_model.H
  assert model.source == str(env["path"])
  assert model.tokenizer is not None and model.tokenizer.bos_id == 1
  ids = model.tokenizer.encode("the cat sat on the mat")
  assert ids and max(ids) < tiny_hf_model.V
  # The converted params went to $KVQ_JAX_CACHE.
  assert len(list((env["root"] / "cache" / "params").iterdir())) == 1


def test_forward_logits_shape_dtype_and_decoder_equality(env):
  model = env["model"]
  logits = kvq_jax.forward_logits(model, IDS)
  assert isinstance(logits, np.ndarray)
  assert logits.shape == (2, 7, tiny_hf_model.V) and logits.dtype == np.float32
  assert np.all(np.isfinite(logits))
  # The decoder's own forward pass, through its Runtime (a separate jit).
  runtime = Runtime(model.decoder)
  own, _ = runtime.prefill(jnp.asarray(IDS),
                           init_cache(model.config, *IDS.shape))
  np.testing.assert_allclose(logits, np.asarray(own), rtol=1e-5, atol=1e-5)


def test_reload_from_param_cache_gives_same_logits(env):
  again = kvq_jax.load_model(str(env["path"]))
  np.testing.assert_array_equal(kvq_jax.forward_logits(again, IDS),
                                kvq_jax.forward_logits(env["model"], IDS))


def test_window_forward_with_a_quantized_cache(env):
  model = env["model"]
  spec = CacheSpec(k=parse_short_spec("int4_g32"),
                   v=parse_short_spec("int4_g32"))
  base = np.asarray(facade.window_forward(model)(IDS))
  quant = np.asarray(facade.window_forward(model, spec)(IDS))
  assert quant.shape == base.shape
  assert not np.array_equal(quant, base)
  # Position 0 attends only to itself; the first token's logits still
  # differ (its own K/V are read back quantized) but only slightly.
  assert np.abs(quant - base).max() < 0.5 * np.abs(base).max()


def test_bfloat16_model(env):
  model = kvq_jax.load_model(str(env["path"]), dtype="bfloat16")
  logits = kvq_jax.forward_logits(model, IDS)
  assert logits.dtype == np.float32
  reference = kvq_jax.forward_logits(env["model"], IDS)
  assert np.abs(logits - reference).max() < 0.05 * np.abs(reference).max()


def test_bad_dtype(env):
  with pytest.raises(ValueError, match="dtype='int8'.*float32, bfloat16"):
    kvq_jax.load_model(str(env["path"]), dtype="int8")


@pytest.mark.parametrize("bad", [
    np.array([1, 2, 3]),                       # Not [B, T].
    np.array([[1.0, 2.0]]),                    # Not integer.
    np.array([[1, -1]]),                       # Negative.
    np.array([[1, tiny_hf_model.V]]),          # Past the vocabulary.
])
def test_bad_ids(env, bad):
  with pytest.raises(ValueError, match="forward_logits"):
    kvq_jax.forward_logits(env["model"], bad)
