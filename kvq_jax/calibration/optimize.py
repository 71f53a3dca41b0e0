"""Learning one layer's K and V clip ratios with optax (Adam).

c = 0.5 + 0.5 * sigmoid(theta) in (0.5, 1); theta starts where c is
`init_ratio`. The loss is `objective.attention_error` on the recorded
calibration windows, for the last `num_queries` query positions of every
window (they see every key, so all keys are exercised at a fraction of the
cost). After training, the learned ratio is kept only if its loss beats the
unclipped one (c = 1) on the same data; otherwise 1.0 is returned.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from kvq_jax.cache.spec import LayerSpec
from kvq_jax.calibration.objective import attention_error, causal_attention
from kvq_jax.calibration.recording import LayerRecord
from kvq_jax.models.rope import Rope

MIN_RATIO = 0.5


@dataclasses.dataclass(frozen=True)
class CalibrationOptions:
  steps: int = 100
  learning_rate: float = 0.05
  num_queries: int = 128
  init_ratio: float = 0.99

  def __post_init__(self):
    for name in ("steps", "num_queries"):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(
            f"CalibrationOptions.{name}={value!r}: allowed: an integer >= 1.")
    if not self.learning_rate > 0:
      raise ValueError(f"CalibrationOptions.learning_rate="
                       f"{self.learning_rate!r}: allowed: > 0.")
    if not MIN_RATIO < self.init_ratio < 1.0:
      raise ValueError(f"CalibrationOptions.init_ratio={self.init_ratio!r}: "
                       f"allowed: in ({MIN_RATIO}, 1).")


@dataclasses.dataclass(frozen=True)
class LayerClip:
  """One layer's result; ratios are 1.0 where a tensor is not quantized."""

  k: float
  v: float
  loss_unclipped: float
  loss_learned: float  # loss of the learned ratios (before the c=1 guard).
  loss: float          # loss of the returned (k, v).


def ratio(theta: jax.Array) -> jax.Array:
  return MIN_RATIO + (1.0 - MIN_RATIO) * jax.nn.sigmoid(theta)


def inverse_ratio(c: float) -> float:
  p = (c - MIN_RATIO) / (1.0 - MIN_RATIO)
  return float(np.log(p / (1.0 - p)))


@functools.lru_cache(maxsize=16)
def _trainer(layer: LayerSpec, rope: Rope, steps: int, learning_rate: float):
  optimizer = optax.adam(learning_rate)

  def loss_fn(theta, data):
    return attention_error(ratio(theta["k"]), ratio(theta["v"]), *data,
                           layer=layer, rope=rope)

  def train(theta, data):
    def step(carry, _):
      theta, opt_state = carry
      loss, grads = jax.value_and_grad(loss_fn)(theta, data)
      updates, opt_state = optimizer.update(grads, opt_state, theta)
      return (optax.apply_updates(theta, updates), opt_state), loss
    (theta, _), losses = jax.lax.scan(step, (theta, optimizer.init(theta)),
                                      None, length=steps)
    return theta, losses

  def loss_at(clip_k, clip_v, data):
    return attention_error(clip_k, clip_v, *data, layer=layer, rope=rope)

  return jax.jit(train), jax.jit(loss_at)


def learn_layer_clip(record: LayerRecord, layer: LayerSpec, rope: Rope,
                     options: CalibrationOptions = CalibrationOptions()
                     ) -> LayerClip:
  """Learns (c_k, c_v) of one layer on its recorded calibration q/k/v."""
  if layer.k is None and layer.v is None:
    return LayerClip(1.0, 1.0, 0.0, 0.0, 0.0)
  t = record.q_BxTxNxH.shape[1]
  nq = min(options.num_queries, t)
  query_pos_Q = jnp.arange(t - nq, t)
  q = jnp.asarray(record.q_BxTxNxH[:, t - nq:])
  k_pre, k_post, v = (jnp.asarray(a) for a in (
      record.k_pre_BxTxKxH, record.k_post_BxTxKxH, record.v_BxTxKxH))
  reference = causal_attention(q, query_pos_Q, k_post, v)
  data = (q, query_pos_Q, k_pre, k_post, v, reference)
  train, loss_at = _trainer(layer, rope, options.steps, options.learning_rate)
  theta0 = jnp.float32(inverse_ratio(options.init_ratio))
  theta, _ = train({"k": theta0, "v": theta0}, data)
  c_k = float(ratio(theta["k"])) if layer.k is not None else 1.0
  c_v = float(ratio(theta["v"])) if layer.v is not None else 1.0
  loss_unclipped = float(loss_at(1.0, 1.0, data))
  loss_learned = float(loss_at(c_k, c_v, data))
  # Each tensor separately: keep a learned ratio only where it helps.
  best = (loss_unclipped, 1.0, 1.0)
  for ck, cv in ((c_k, 1.0), (1.0, c_v), (c_k, c_v)):
    loss = loss_learned if (ck, cv) == (c_k, c_v) else float(
        loss_at(ck, cv, data))
    if loss < best[0]:
      best = (loss, ck, cv)
  return LayerClip(k=best[1], v=best[2], loss_unclipped=loss_unclipped,
                   loss_learned=loss_learned, loss=best[0])


def learn_clip_ratios(records: list[LayerRecord], layers: list[LayerSpec],
                      ropes: Rope | Sequence[Rope],
                      options: CalibrationOptions = CalibrationOptions(),
                      progress=None) -> list[LayerClip]:
  """`learn_layer_clip` for every layer (layers[i] is layer i's spec).

  `ropes`: one Rope for every layer, or one per layer (Gemma 3's local and
  global layers rotate with different bases).
  """
  if len(records) != len(layers):
    raise ValueError(f"learn_clip_ratios: {len(records)} records for "
                     f"{len(layers)} layer specs; allowed: one per layer.")
  ropes = [ropes] * len(layers) if isinstance(ropes, Rope) else list(ropes)
  if len(ropes) != len(layers):
    raise ValueError(f"learn_clip_ratios: {len(ropes)} ropes for "
                     f"{len(layers)} layers; allowed: one, or one per layer.")
  out = []
  for i, (record, layer, rope) in enumerate(zip(records, layers, ropes)):
    out.append(learn_layer_clip(record, layer, rope, options))
    if progress is not None:
      progress(i + 1, len(layers))
  return out
