"""kvq_jax.sharding on 8 simulated CPU devices (a subprocess: XLA_FLAGS must
be set before jax starts, and this pytest process has already started it).

sharded_check.py runs prefill + 3 decode steps of a tiny model (K = 4 KV
heads) with dense and int4 caches on mesh 2x4 (tensor parallel:
equal up to float reassociation), the evaluation forward with kivi2 and
kvq4 caches on mesh 2x3 and kivi2 on 1x4 (bit-exact),
printing one JSON line checked here. `experiments.run --mesh` end to end
(the tiny HF model, K = 1: KV heads fall back to replication) is
test_multiprocess.py's: a 2x2 mesh over 2 processes against the no-mesh run.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest
from jax.sharding import PartitionSpec as P

from kvq_jax.sharding.cache import _spec

HERE = pathlib.Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def result(tmp_path_factory):
  root = tmp_path_factory.mktemp("sharding")
  # The suite's own XLA flags (tests/conftest.py: faster compiles) too.
  flags = os.environ.get("XLA_FLAGS", "")
  env = dict(os.environ, JAX_PLATFORMS="cpu", KVQ_JAX_CACHE=str(root / "cache"),
             XLA_FLAGS=f"{flags} --xla_force_host_platform_device_count=8")
  proc = subprocess.run(
      [sys.executable, str(HERE / "sharded_check.py")], env=env,
      capture_output=True, text=True, timeout=600, check=False,
      cwd=HERE.parents[1])
  assert proc.returncode == 0, proc.stderr[-4000:]
  line = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
  assert line, proc.stdout[-2000:]
  return json.loads(line[-1][len("RESULT "):])


@pytest.mark.parametrize("mesh", ["2x4"])
@pytest.mark.parametrize("kind", ["dense", "int4"])
def test_sharded_decode_equals_unsharded(result, mesh, kind):
  assert result["device_count"] == 8
  r = result["models"][f"{mesh}/{kind}"]
  assert r["finite"] and r["max_abs_diff"] <= 1e-5, r["max_abs_diff"]
  assert r["num_devices"] == 8 and r["q_kernel_spec"] == "P(None, 'model')"
  want = ("P('data', None, 'model')" if kind == "dense" else
          "P('data', 'model')")
  for layer in r["specs"]:
    assert layer[-1] == "P('data',)"  # length_B
    assert all(s == want for s in layer[:-1]), layer
  for layer in r["specs_after_decode"]:  # Non-empty leaves stay sharded.
    assert all(s == want for s in layer[:2 if kind == "dense" else 4]), layer


def test_sharded_paged_cache(result):
  # The paged int4 cache equals the contiguous one unsharded, and sharded
  # on 2x4 equals itself unsharded; its pool [N, K, P, ...] shards over
  # 'model' only (any slot may own any page), the per-slot leaves as a
  # quantized cache's.
  assert result["models"]["paged_vs_contiguous_int4"] <= 1e-5
  r = result["models"]["2x4/paged_int4"]
  assert r["finite"] and r["max_abs_diff"] <= 1e-5, r["max_abs_diff"]
  for layer in r["specs"]:
    # Leaves in field order: pool k (data, scale), pool v (data, scale),
    # windows and sinks (empty: replicated), length_B, block table.
    assert layer[:4] == ["P(None, 'model')"] * 4, layer
    assert layer[-2:] == ["P('data',)"] * 2, layer


@pytest.mark.parametrize("mesh, kind", [
    ("2x3", "kivi2"), ("2x3", "kvq4"), ("1x4", "kivi2")])
def test_sharded_evaluation_is_bit_identical(result, mesh, kind):
  # Logits and every packed cache leaf (codes, scales, zeros, windows,
  # lengths) of the evaluation forward equal the unsharded run's exactly.
  r = result["eval"][f"{mesh}/{kind}"]
  assert r["logits_equal"]
  assert r["num_leaves"] >= 6 and all(r["leaves_equal"]), r["leaves_equal"]
  assert r["codes_nonzero"]


def test_partition_rule_falls_back_to_replication():
  # [B, K, S, H] storage: batch 3 on 2-way data, 1 KV head on 4-way model.
  assert _spec((3, 1, 16, 8), 1, 2, 4) == P()
  assert _spec((4, 1, 16, 8), 1, 2, 4) == P("data")
  assert _spec((3, 4, 16, 8), 1, 2, 4) == P(None, "model")
  assert _spec((4, 4, 16, 8), 1, 1, 4) == P(None, "model")  # data size 1.
  assert _spec((4,), None, 2, 4) == P("data")
