"""Per-token quality metrics from logits (jittable)."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def next_token_nll(logits_BxTxV: jax.Array, tokens_BxT: jax.Array) -> jax.Array:
  """NLL [B, T-1] of token t+1 under the logits at position t (float32)."""
  logp_BxTxV = jax.nn.log_softmax(logits_BxTxV[:, :-1].astype(jnp.float32))
  targets_BxT = tokens_BxT[:, 1:]
  return -jnp.take_along_axis(logp_BxTxV, targets_BxT[..., None], -1)[..., 0]


def kl_divergence(logp_base: jax.Array, logp_quant: jax.Array) -> jax.Array:
  """KL(base || quant) in nats over the last axis, from log-probabilities."""
  return jnp.sum(jnp.exp(logp_base) * (logp_base - logp_quant), axis=-1)


def compare_logits(base_BxTxV: jax.Array, quant_BxTxV: jax.Array,
                   tokens_BxT: jax.Array) -> dict[str, jax.Array]:
  """Per-prediction metrics [B, T-1] of a quantized run against its baseline.

  nll_base, nll_quant; kl = KL(baseline || quant) in nats; top1 = whether the
  two argmax tokens agree.
  """
  logp_b = jax.nn.log_softmax(base_BxTxV[:, :-1].astype(jnp.float32))
  logp_q = jax.nn.log_softmax(quant_BxTxV[:, :-1].astype(jnp.float32))
  targets = tokens_BxT[:, 1:, None]
  return {
      "nll_base": -jnp.take_along_axis(logp_b, targets, -1)[..., 0],
      "nll_quant": -jnp.take_along_axis(logp_q, targets, -1)[..., 0],
      "kl": kl_divergence(logp_b, logp_q),
      "top1": jnp.argmax(logp_b, -1) == jnp.argmax(logp_q, -1),
  }
