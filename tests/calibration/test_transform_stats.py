"""Key statistics in transform mode (issue 34) on Gaussians of known
covariance: the basis, the error tables and the allocation they give."""

from __future__ import annotations

import numpy as np
import pytest

from kvq_jax.calibration.key_stats import (KeyStatsOptions, key_affines,
                                           layer_affine)
from kvq_jax.calibration.recording import LayerRecord
from kvq_jax.persist.key_stats_store import load_key_stats, save_key_stats
from kvq_jax.quant.bit_allocation import reverse_water_filling

H = 8
VARIANCES = 4.0 ** np.arange(4, -4, -1)  # 256 ... 1/64: 2 bits apart.
OPTIONS = KeyStatsOptions(mode="transform", rotation="pca")


def _record(seed=0, tokens=20000, kv_heads=1):
  """Keys = mean + Gaussian with covariance Q diag(VARIANCES) Q^T (Q a
  random orthogonal basis); isotropic unit queries (weights all 1)."""
  rng = np.random.default_rng(seed)
  basis = np.linalg.qr(rng.normal(size=(H, H)))[0]
  z = rng.normal(size=(1, tokens, kv_heads, H)) * np.sqrt(VARIANCES)
  k = z @ basis.T + np.linspace(-3, 3, H)
  q = np.ones((1, tokens, kv_heads, H))
  zeros = np.zeros_like(k)
  return LayerRecord(q_BxTxNxH=q, k_pre_BxTxKxH=k, k_post_BxTxKxH=zeros,
                     v_BxTxKxH=zeros), basis


def test_basis_and_tables_recover_the_known_covariance():
  record, basis = _record()
  affine = layer_affine(record, H, OPTIONS)
  rot = affine.rotation_array()[0]  # rows: the components, stored int8.
  # The rows are the true principal axes (up to sign), in decreasing
  # order of variance, to the int8 rows' precision.
  overlap = np.abs(rot @ basis)
  np.testing.assert_allclose(overlap, np.eye(H), atol=2e-2)
  # Each component's standard deviation is its axis's.
  np.testing.assert_allclose(np.asarray(affine.scale)[0] ** 2, VARIANCES,
                             rtol=0.05)
  # The 0-bit column is the weighted variance of each (unit-variance)
  # component times its weight s^2 qrms^2 = variance: the variances.
  table = np.asarray(affine.distortion)
  np.testing.assert_allclose(table[:, 0], VARIANCES, rtol=0.05)
  # Gaussian components with codebooks fitted to them: the Lloyd-Max
  # errors of a unit Gaussian at 1..5 bits (Max 1960), then 6 dB a bit.
  lloyd_max = [0.3634, 0.1175, 0.03454, 0.009497, 0.002499]
  np.testing.assert_allclose(table[:, 1:6] / table[:, :1], np.broadcast_to(
      lloyd_max, (H, 5)), rtol=0.08)
  ratio = table[:, 6:8] / table[:, 5:7]
  assert np.all((ratio > 0.22) & (ratio < 0.31))


def test_allocation_follows_water_filling():
  record, _ = _record(seed=1)
  affine = layer_affine(record, H, OPTIONS)
  widths = np.asarray(affine.component_widths(3))  # 24 bits in all.
  bits, _ = reverse_water_filling(VARIANCES, 3.0)
  # Variances 2 bits apart: water-filling gives 6.5, 5.5, ... ; the
  # integer allocation sits within one bit of it, in decreasing order.
  assert widths.sum() == 24
  assert np.all(np.abs(widths - bits) <= 1.0 + 1e-9)
  assert np.all(np.diff(widths) <= 0)
  # Unequal bits beat equal bits by the coding gain's order (high rate:
  # 10 log10(AM / GM) = 16.3 dB here; measured on the calibration tables).
  table = np.asarray(affine.distortion)
  equal = table[:, 3].sum()
  allocated = table[np.arange(H), widths].sum()
  assert 10 * np.log10(equal / allocated) > 10.0


def test_transform_stats_round_trip_and_validate(tmp_path):
  records = [_record(seed=s, tokens=2000, kv_heads=2)[0] for s in range(2)]
  affines = key_affines(records, H, OPTIONS)
  save_key_stats(tmp_path / "kt", affines, {"model": "synthetic"})
  loaded = load_key_stats(tmp_path / "kt")
  assert loaded == affines
  assert loaded[0].component_widths(2) == affines[0].component_widths(2)
  # Stored: int8 rotation codes with a float32 scale per row.
  arrays = loaded[0].arrays()
  assert [a.dtype.name for a in arrays] == ["float32", "float32", "int8",
                                            "float32"]
  assert arrays[2].nbytes == 2 * H * H and arrays[3].shape == (2, H)
  with pytest.raises(ValueError, match="codebook_bits needs mode='range'"):
    KeyStatsOptions(mode="transform", codebook_bits=(2,))
