"""rounding='ggml' reproduces gguf-py's Q8_0, Q4_0, Q4_1, Q5_0 and Q5_1.

The oracle is the installed `gguf` package (`gguf.quants`, bit-exact with
ggml-quants.c): quantize -> dequantize of float32 rows whose last axis holds
blocks of 32. Ours groups 32 along head_dim, so the tensors are compared as
they are, with head_dim as gguf's row axis.
"""

from __future__ import annotations

import dataclasses

from gguf import GGMLQuantizationType, quants
import jax.numpy as jnp
import numpy as np
import pytest

from kvq_jax.quant import (GGML_TYPES, QuantSpec, dequantize, ggml_name,
                           ggml_spec, quantize)

SEEDS = (0, 1, 2, 3)


def _gguf_round_trip(x: np.ndarray, name: str) -> np.ndarray:
  qtype = GGMLQuantizationType[name.upper()]
  return quants.dequantize(quants.quantize(x, qtype), qtype)


def _ours(x: np.ndarray, name: str) -> np.ndarray:
  qa = quantize(jnp.asarray(x), ggml_spec(name))
  return np.asarray(dequantize(qa, jnp.float32))


def _assert_exact(x: np.ndarray, name: str) -> None:
  x = np.ascontiguousarray(x, np.float32)
  want = _gguf_round_trip(x.reshape(-1, x.shape[-1]), name).reshape(x.shape)
  got = _ours(x, name)
  assert got.dtype == np.float32 and got.shape == x.shape
  mismatch = np.flatnonzero(got.ravel() != want.ravel())
  assert np.array_equal(got, want), (
      f"{name}: {mismatch.size} of {x.size} differ, first at flat index "
      f"{mismatch[:5]}: ours {got.ravel()[mismatch[:5]]}, gguf "
      f"{want.ravel()[mismatch[:5]]}")


def _random_rows(seed: int) -> np.ndarray:
  """[64, 128] float32: 4 blocks per row, scales from 1e-3 to 1e3."""
  rng = np.random.default_rng(seed)
  x = rng.standard_normal((64, 128)) * np.exp(rng.uniform(-7, 7, (64, 1)))
  x += rng.uniform(-1, 1, (64, 1)) * np.abs(x).mean(axis=1, keepdims=True)
  return x.astype(np.float32)


def _special_blocks(seed: int) -> np.ndarray:
  """Rows of 32 elements, one edge case per row."""
  rng = np.random.default_rng(seed)
  base = lambda s=1.0: rng.standard_normal(32) * s  # noqa: E731
  rows = [np.zeros(32)]                                # All zero.
  outlier = base(0.1)
  outlier[rng.integers(32)] = 37.0                     # One positive outlier.
  rows.append(outlier)
  outlier = base(0.1)
  outlier[rng.integers(32)] = -37.0                    # One negative outlier.
  rows.append(outlier)
  rows.append(-np.abs(base(3.0)) - 1.0)                # All negative.
  rows.append(np.abs(base(3.0)) + 1.0)                 # All positive.
  neg_extreme = base()
  neg_extreme[5] = -np.abs(neg_extreme).max() * 1.5    # Largest is negative.
  rows.append(neg_extreme)
  tie = base()
  tie[3], tie[20] = 4.0, -4.0                          # Tie, + first.
  rows.append(tie)
  rows.append(-tie)                                    # Tie, - first.
  rows.append(np.full(32, 2.7))                        # Constant (d = 0 asym).
  rows.append(np.full(32, -1e-3))
  single = np.zeros(32)
  single[31] = -0.3                                    # One non-zero value.
  rows.append(single)
  rows.append(base() * 10.0 ** rng.uniform(-3, 3, 32))  # Wide dynamic range.
  rows.append(np.round(base(4.0)))                     # Integers (ties).
  rows.append(np.arange(32) - 16.0)                    # Exact q4_0 grid.
  return np.stack(rows).astype(np.float32)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("name", GGML_TYPES)
def test_random_rows_match_gguf(name, seed):
  _assert_exact(_random_rows(seed), name)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("name", GGML_TYPES)
def test_edge_case_blocks_match_gguf(name, seed):
  _assert_exact(_special_blocks(seed), name)


@pytest.mark.parametrize("name", GGML_TYPES)
def test_kv_shaped_tensor_matches_gguf(name):
  # [B, T, K, H] with head_dim 64: two blocks per (b, t, k) row.
  rng = np.random.default_rng(11)
  x = rng.standard_normal((2, 24, 3, 64)) * rng.uniform(0.01, 20, (1, 24, 3, 1))
  _assert_exact(x.astype(np.float32), name)


def test_specs_and_names():
  assert GGML_TYPES == ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1")
  q4_0 = ggml_spec("q4_0")
  assert (q4_0.format, q4_0.scheme, q4_0.granularity, q4_0.group_size,
          q4_0.scale_dtype, q4_0.rounding) == (
              "int4", "symmetric", "per_group", 32, "float16", "ggml")
  assert ggml_spec("q8_0").scheme == "symmetric_narrow"
  assert ggml_spec("q5_1").format == "int5"
  for name in GGML_TYPES:
    assert ggml_name(ggml_spec(name)) == name
    assert ggml_name(dataclasses.replace(ggml_spec(name), axis=-1)) == name
  assert ggml_name(QuantSpec(format="int4", group_size=32,
                             scale_dtype="float16")) is None  # kvq rounding.
  assert ggml_name(dataclasses.replace(q4_0, group_size=64)) is None
  with pytest.raises(ValueError, match=r"'q4_k'.*allowed: q8_0, q4_0"):
    ggml_spec("q4_k")


def test_q4_0_hand_computed_block():
  # m = -8 (first of largest magnitude) -> d = -8 / -8 = 1, id = 1;
  # u = trunc(x + 8.5) clipped to 0..15: -8 -> 0, 7.4 -> 15, 8 -> 16 -> 15.
  x = np.zeros((1, 32), np.float32)
  x[0, :4] = [-8.0, 7.4, 8.0, -0.6]
  qa = quantize(jnp.asarray(x), ggml_spec("q4_0"))
  assert float(qa.scale[0, 0]) == 1.0 and qa.scale.dtype == jnp.float16
  got = np.asarray(dequantize(qa))
  np.testing.assert_array_equal(got[0, :4], [-8.0, 7.0, 7.0, -1.0])
  np.testing.assert_array_equal(got, _gguf_round_trip(x, "q4_0"))


def test_q4_1_scale_and_min_are_rounded_to_nearest():
  # min = 0.1, max = 1.6: d = 1.5 / 15 = 0.1 (float32), stored float16
  # 0.0999755859375 (nearest; kvq would round up); m = float16(0.1) =
  # 0.0999755859375 too. Codes come from the float32 d and min.
  x = np.linspace(0.1, 1.6, 32, dtype=np.float32)[None]
  qa = quantize(jnp.asarray(x), ggml_spec("q4_1"))
  assert float(qa.scale[0, 0]) == float(np.float16(np.float32(1.5) / 15))
  assert float(qa.zero[0, 0]) == float(np.float16(np.float32(0.1)))
  np.testing.assert_array_equal(np.asarray(dequantize(qa)),
                                _gguf_round_trip(x, "q4_1"))


def test_q4_0_product_is_rounded_before_the_add():
  # d = -6.8417063 / -8 = 0.8552133, id = 1.169299; for x = 2.1380327,
  # float32(x * id) + 8.5 rounds up to 11.0 (ggml: code 11), while a fused
  # multiply-add x * id + 8.5 (one rounding) stays below 11 (code 10).
  x = np.zeros((1, 32), np.float32)
  x[0, :2] = np.array([3235573570, 1074320775], np.uint32).view(np.float32)
  want = _gguf_round_trip(x, "q4_0")
  d = float(np.float16(x[0, 0] / np.float32(-8)))
  assert want[0, 1] == np.float32(3 * d)  # Code 11 = q 3.
  np.testing.assert_array_equal(_ours(x, "q4_0"), want)


def test_q5_1_scale_is_a_division_not_a_reciprocal_multiply():
  # A SmolLM2 layer-0 value block: (hi - lo) / 31 = 0.0070225564 (one
  # float32 division, as gguf-py), where (hi - lo) * (1 / 31), XLA's
  # rewrite of a division by a broadcast constant, gives 0.0070225559.
  # With the larger id that follows, element 10's (x - lo) * id is
  # 21.500002 instead of gguf's 21.499998: code 22 instead of 21 (the
  # float16 scale is the same either way).
  x = np.array([[
      980453754, 3159531702, 1029862242, 1034510618, 3167719796, 3170241545,
      3188341760, 1028842173, 3142767202, 3139415578, 1015217770, 3151107077,
      1005171166, 3149423526, 3143662562, 3165635723, 3161373790, 1002118220,
      3170173679, 1011947778, 3147963505, 1013735089, 3174801649, 1028313523,
      1015349893, 3153307668, 3163782118, 1012589504, 3163329193, 3146272165,
      1020647894, 3179020042]], np.uint32).view(np.float32)
  hi_lo = x.max() - x.min()
  assert hi_lo / np.float32(31) != hi_lo * (np.float32(1) / np.float32(31))
  want = _gguf_round_trip(x, "q5_1")
  np.testing.assert_array_equal(_ours(x, "q5_1"), want)
  qa = quantize(jnp.asarray(x), ggml_spec("q5_1"))
  assert float(qa.scale[0, 0]) == float(np.float16(hi_lo / np.float32(31)))


@pytest.mark.slow
def test_real_smollm2_keys_and_values_match_gguf():
  import kvq_jax  # pylint: disable=import-outside-toplevel
  from kvq_jax.calibration.recording import record_qkv  # pylint: disable=import-outside-toplevel

  model = kvq_jax.load_model("smollm2-135m")
  text = ("The tower is 324 metres tall, about the same height as an "
          "81-storey building, and the tallest structure in Paris. Its base "
          "is square, measuring 125 metres on each side. During its "
          "construction, the Eiffel Tower surpassed the Washington Monument "
          "to become the tallest man-made structure in the world, a title it "
          "held for 41 years until the Chrysler Building in New York City "
          "was finished in 1930.")
  ids = np.asarray([model.tokenizer.encode(text)[:64]], np.int32)
  assert ids.shape == (1, 64)
  records = record_qkv(model, ids)
  checked = 0
  for layer in (0, len(records) // 2, len(records) - 1):
    rec = records[layer]
    for x in (rec.k_pre_BxTxKxH, rec.k_post_BxTxKxH, rec.v_BxTxKxH):
      assert x.shape[-1] % 32 == 0 and np.all(np.isfinite(x))
      for name in GGML_TYPES:
        _assert_exact(x, name)
        checked += 1
  assert checked == 3 * 3 * len(GGML_TYPES)
