"""Run as a script under 8 simulated CPU devices; prints one JSON line.

  XLA_FLAGS=--xla_force_host_platform_device_count=8 python \
      tests/robustness/sharded_check.py

Checks (consumed by test_sharding.py): sharded prefill + decode equals the
unsharded run for dense and int4 caches on mesh 2x4, the cache
leaves carry the expected PartitionSpecs; the evaluation forward
(`sharded_window_prefill`) gives bit-identical logits and packed cache
leaves for kivi2 (per-channel keys, token-local value groups and a residual
window) and kvq4 (pre-RoPE per-channel keys, Hadamard token-local values)
on mesh 2x3 (data and model axes), and for kivi2 (the most cache leaves) on
mesh 1x4 (3 KV heads: 4 does not divide them, so they replicate). (An
int4_g32 case ran here too: its token-local groups are the values' format
of both kinds, and token-local keys are the 2x4 decode check's int4 cache;
dropped to keep CI inside its budget.)
`experiments.run --mesh` end to end is test_multiprocess.py's (a 2x2 mesh
over 2 processes against the no-mesh run).
"""

from __future__ import annotations

import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from kvq_jax.cache.factory import init_cache  # noqa: E402
from kvq_jax.cache.paged.model import (init_paged_cache,  # noqa: E402
                                       with_block_table)
from kvq_jax.cache.spec import CacheSpec  # noqa: E402
from kvq_jax.models.config import ModelConfig  # noqa: E402
from kvq_jax.models.params import decoder_from_params, random_params  # noqa: E402
from kvq_jax.models.runtime import Runtime  # noqa: E402
from kvq_jax.quant import QuantSpec  # noqa: E402
from kvq_jax import sharding  # noqa: E402

# K = 4 KV heads: divisible by both 'model' sizes (4 and 2).
CONFIG = ModelConfig(vocab_size=61, hidden_size=64, intermediate_size=128,
                     num_layers=2, num_heads=8, num_kv_heads=4, head_dim=16,
                     name="llama")
INT4 = QuantSpec("int4", "symmetric", "per_group", 8)
SPECS = {"dense": None, "int4": CacheSpec(k=INT4, v=INT4, block_size=16)}
B, T, STEPS, CAPACITY = 4, 6, 3, 16
# The int4 cache paged: pages of 8 tokens, 2 per slot, scattered in a pool
# of 12 (page 0 the null page).
PAGE = 8
PAGE_TABLE = (np.random.default_rng(7).permutation(np.arange(1, 12))[:2 * B]
              .reshape(B, 2).astype(np.int32))


def _fresh_cache(kind: str) -> list:
  if kind == "paged_int4":
    return with_block_table(init_paged_cache(
        CONFIG, B, 12, CAPACITY // PAGE, SPECS["int4"], page_size=PAGE),
        PAGE_TABLE)
  return init_cache(CONFIG, B, CAPACITY, SPECS[kind])


def _decode(runtime, cache, tokens):
  logits, cache = runtime.prefill(tokens, cache)
  outs = [np.asarray(logits[:, -1])]
  token = jnp.argmax(logits[:, -1], -1).astype(jnp.int32)
  for _ in range(STEPS):
    logits, cache = runtime.decode(token, cache)
    outs.append(np.asarray(logits))
    token = jnp.argmax(logits, -1).astype(jnp.int32)
  return np.stack(outs), cache


def _specs(cache):
  return [[str(x.sharding.spec) for x in jax.tree_util.tree_leaves(layer)]
          for layer in cache]


def model_checks() -> dict:
  params = random_params(CONFIG, seed=3, scale=0.1)
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, 61, (B, T)),
                       jnp.int32)
  out = {}
  reference = {}
  kinds = (*SPECS, "paged_int4")
  for kind in kinds:
    runtime = Runtime(decoder_from_params(CONFIG, params))
    reference[kind], _ = _decode(runtime, _fresh_cache(kind), tokens)
  out["paged_vs_contiguous_int4"] = float(np.max(np.abs(
      reference["paged_int4"] - reference["int4"])))
  for mesh_text in ("2x4",):
    mesh = sharding.make_mesh(mesh_text)
    decoder = sharding.shard_params(decoder_from_params(CONFIG, params), mesh)
    runtime = Runtime(decoder)
    q_kernel = decoder.layers[0].attn.q.kernel[...]
    for kind in kinds:
      cache = sharding.shard_cache(_fresh_cache(kind), mesh)
      placed = _specs(cache)
      logits, final = _decode(runtime, cache, tokens)
      out[f"{mesh_text}/{kind}"] = {
          "max_abs_diff": float(np.max(np.abs(logits - reference[kind]))),
          "specs": placed, "specs_after_decode": _specs(final),
          "q_kernel_spec": str(q_kernel.sharding.spec),
          "num_devices": len(q_kernel.sharding.device_set),
          "finite": bool(np.all(np.isfinite(logits)))}
  return out


# 3 KV heads / 9 query heads (a 4-way 'model' axis divides neither; the MLP
# hidden size 96 divides by 3 and 4), head_dim 32 for groups of 32.
EVAL_CONFIG = ModelConfig(vocab_size=61, hidden_size=96, intermediate_size=96,
                          num_layers=2, num_heads=9, num_kv_heads=3,
                          head_dim=32, name="llama")
_PC32 = QuantSpec("int2", "asymmetric", "per_channel", 32)
EVAL_SPECS = {
    "kivi2": CacheSpec(k=_PC32, v=QuantSpec("int2", "asymmetric", "per_group",
                                            32), residual=16),
    "kvq4": CacheSpec(k=QuantSpec("int4", "asymmetric", "per_channel", 32),
                      v=QuantSpec("int4", "asymmetric", "per_group", 32),
                      key_rope="pre", hadamard_v=True),
}
# Kind -> meshes. The replication fallback (1x4) does not depend on the
# format (kvq_jax.sharding.cache._spec looks at leaf shapes only): one kind,
# the one with the most leaves, runs it (one compile per extra kind saved).
EVAL_MESHES = {"kivi2": ("2x3", "1x4"), "kvq4": ("2x3",)}


def eval_checks() -> dict:
  """Sharded evaluation forward vs unsharded: exact equality per leaf."""
  from kvq_jax.facade import LoadedModel, window_prefill
  params = random_params(EVAL_CONFIG, seed=4, scale=0.3)
  tokens = np.random.default_rng(1).integers(0, 61, (6, 64)).astype(np.int32)
  plain = LoadedModel(decoder_from_params(EVAL_CONFIG, params), None, "x")
  out = {}
  for kind, spec in EVAL_SPECS.items():
    ref_logits, ref_cache = window_prefill(plain, spec)(tokens)
    ref_leaves = jax.tree_util.tree_leaves(ref_cache)
    for mesh_text in EVAL_MESHES[kind]:
      mesh = sharding.make_mesh(mesh_text)
      model = LoadedModel(sharding.shard_params(
          decoder_from_params(EVAL_CONFIG, params), mesh), None, "x")
      logits, cache = sharding.sharded_window_prefill(model, spec,
                                                      mesh=mesh)(tokens)
      leaves = jax.tree_util.tree_leaves(cache)
      out[f"{mesh_text}/{kind}"] = {
          "logits_equal": bool(np.array_equal(np.asarray(logits),
                                              np.asarray(ref_logits))),
          "num_leaves": len(leaves),
          "leaves_equal": [bool(np.array_equal(np.asarray(a), np.asarray(b)))
                           for a, b in zip(leaves, ref_leaves)],
          "codes_nonzero": bool(any(np.any(np.asarray(x) != 0) for x in leaves
                                    if np.asarray(x).dtype == np.uint8))}
  return out


def main(argv):
  del argv
  result = {"device_count": jax.device_count(), "models": model_checks(),
            "eval": eval_checks()}
  print("RESULT " + json.dumps(result))


if __name__ == "__main__":
  main(sys.argv)
