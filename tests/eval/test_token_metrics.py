"""next_token_nll / compare_logits on hand-made logits."""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
import pytest

from kvq_jax.eval.token_metrics import compare_logits, next_token_nll

LN2 = math.log(2.0)
# One sequence of 3 tokens over a vocabulary of 3. Position 0: uniform;
# position 1: probabilities (1/4, 1/2, 1/4); position 2 is never scored.
BASE = np.array([[[0.0, 0.0, 0.0], [0.0, LN2, 0.0], [9.0, -9.0, 3.0]]],
                np.float32)
TOKENS = np.array([[2, 0, 1]], np.int32)


def test_next_token_nll_by_hand():
  nll = np.asarray(next_token_nll(jnp.asarray(BASE), jnp.asarray(TOKENS)))
  assert nll.shape == (1, 2) and nll.dtype == np.float32
  # Target of position 0 is token 0 (p = 1/3), of position 1 is token 1 (1/2).
  np.testing.assert_allclose(nll, [[math.log(3.0), LN2]], rtol=1e-6)


def test_next_token_nll_upcasts_bfloat16():
  nll = next_token_nll(jnp.asarray(BASE, jnp.bfloat16), jnp.asarray(TOKENS))
  assert nll.dtype == jnp.float32


def test_identical_logits_have_zero_kl_and_full_agreement():
  out = {k: np.asarray(v) for k, v in compare_logits(
      jnp.asarray(BASE), jnp.asarray(BASE), jnp.asarray(TOKENS)).items()}
  assert set(out) == {"nll_base", "nll_quant", "kl", "top1"}
  np.testing.assert_allclose(out["kl"], 0.0, atol=1e-7)
  np.testing.assert_array_equal(out["top1"], [[True, True]])
  np.testing.assert_array_equal(out["nll_base"], out["nll_quant"])


def test_kl_and_top1_by_hand():
  quant = BASE.copy()
  quant[0, 1] = [0.0, 0.0, 0.0]  # Uniform instead of (1/4, 1/2, 1/4).
  quant[0, 0] = [0.0, 0.0, 5.0]  # Argmax moves from 0 (tie) to 2.
  out = {k: np.asarray(v) for k, v in compare_logits(
      jnp.asarray(BASE), jnp.asarray(quant), jnp.asarray(TOKENS)).items()}
  # KL(p || uniform) = sum p log(3 p) with p = (1/4, 1/2, 1/4).
  kl_pos1 = 0.5 * math.log(0.75) + 0.5 * math.log(1.5)
  assert out["kl"][0, 1] == pytest.approx(kl_pos1, rel=1e-5)
  q0 = np.exp([0.0, 0.0, 5.0]) / np.exp([0.0, 0.0, 5.0]).sum()
  assert out["kl"][0, 0] == pytest.approx(
      float(np.sum(np.full(3, 1 / 3) * np.log((1 / 3) / q0))), rel=1e-5)
  np.testing.assert_array_equal(out["top1"], [[False, False]])
  assert out["nll_quant"][0, 1] == pytest.approx(math.log(3.0), rel=1e-6)
  assert out["nll_quant"][0, 0] == pytest.approx(-math.log(q0[0]), rel=1e-5)
  assert out["nll_base"][0, 1] == pytest.approx(LN2, rel=1e-6)
