"""KL-objective calibration of static-key ranges, end to end with optax.

Issue 14's method 5. For a cache of static keys (scheme='static': codes in a
calibrated per-channel range, `KeyAffine` mode "range"), learn one log-ratio
theta per layer, kv head and key channel (or one per layer) that stretches
or shrinks the calibrated range: the cache stores

    z = (k_pre - mu) / (s * exp(theta))

so theta < 0 clips harder and theta > 0 widens the range. The objective is
the model's own next-token KL to the full-precision cache,

    KL = mean over scored positions of sum_v p_base(v) (log p_base(v) -
         log p_quant(v)),

on calibration windows (from the end of the text, disjoint from the
evaluation windows), minimised with Adam over all layers at once. The
forward pass is the quantized cache's, emulated at write time exactly as
`research.fake_quant` does (sinks included; `FitLayerCache`), with the
rounding made differentiable by the straight-through estimator (identity
inside the range [-1, 1] and for kept outliers, zero for clipped values;
LSQ's): the gradient of a reconstructed key s * exp(theta) * q(z) with
respect to exp(theta) is s (q(z) - z) inside the range and s q(z) for a
clipped one, so the fit trades clipping against rounding error where the
model's output says it matters. Values, whose format is not fitted, pass their rounding
the same way so that gradients reach earlier layers through them.

The fitted ranges are written as ordinary range-mode key stats (scale s *
exp(theta); `key_stats_store`), so any preset loads them with
`cache.key_stats=DIR` and the cache itself is unchanged.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx, struct

from kvq_jax.cache import init_layer_caches
from kvq_jax.cache.dense import write_and_attend
from kvq_jax.cache.key_affine import KeyAffine
from kvq_jax.cache.spec import LayerSpec
from kvq_jax.eval.token_metrics import kl_divergence
from kvq_jax.models.decoder import Decoder
from kvq_jax.models.rope import Rope
from kvq_jax.research import fake_quant

GRANULARITIES = ("channel", "layer")


@dataclasses.dataclass(frozen=True)
class KLFitOptions:
  """steps: Adam steps, one calibration window each (cycling);
  learning_rate: Adam's, on theta; granularity: "channel" (theta per layer,
  kv head and channel) or "layer" (one theta per layer)."""

  steps: int = 32
  learning_rate: float = 0.01
  granularity: str = "layer"

  def __post_init__(self):
    if isinstance(self.steps, bool) or not isinstance(self.steps, int) or (
        self.steps < 1):
      raise ValueError(f"KLFitOptions.steps={self.steps!r}: allowed: an "
                       "integer >= 1.")
    if not self.learning_rate > 0:
      raise ValueError(f"KLFitOptions.learning_rate={self.learning_rate!r}: "
                       "allowed: > 0.")
    if self.granularity not in GRANULARITIES:
      raise ValueError(
          f"KLFitOptions.granularity={self.granularity!r}: allowed: "
          f"{', '.join(GRANULARITIES)}.")


def check_fittable(layer: LayerSpec, where: str) -> None:
  """ValueError unless `layer` stores static keys in calibrated ranges and
  is emulated exactly at write time (`fake_quant.check_emulable`)."""
  fake_quant.check_emulable(layer, where)
  affine = layer.key_affine
  if (layer.k is None or layer.k.scheme != "static" or affine is None
      or affine.mode != "range" or layer.key_rope != "pre"):
    raise ValueError(
        f"{where}: the KL fit learns the calibrated ranges of static keys; "
        "allowed: k with scheme='static', key_rope='pre' and range-mode key "
        "stats (experiments.calibrate_keys --mode=range), e.g. --config=kq4.")


def straight_through(x: jax.Array, fn: Callable[[jax.Array], jax.Array],
                     bound: float | None = None) -> jax.Array:
  """fn(x) forward; backward the identity (fn itself is never
  differentiated), except, with `bound`, where |x| > bound and fn did not
  keep x exactly (a value clipped to the range, not an outlier): there the
  gradient is 0, as the clipped output does not move with x (LSQ)."""
  stopped = jax.lax.stop_gradient(x)
  out = jax.lax.stop_gradient(fn(stopped))
  if bound is None:
    return out + (x - stopped)
  passes = (jnp.abs(stopped) <= bound) | (out == stopped)
  return out + jnp.where(passes, x - stopped, 0.0)


@struct.dataclass
class FitLayerCache:
  """Post-RoPE K/V [B, S, K, H] in float32, written through the layer's
  formats with the key range stretched by exp(theta_KxH)."""

  k_BxSxKxH: jax.Array
  v_BxSxKxH: jax.Array
  length_B: jax.Array
  theta_KxH: jax.Array
  capacity: int = struct.field(pytree_node=False)
  layer: LayerSpec = struct.field(pytree_node=False)
  dtype: str = struct.field(pytree_node=False)
  sliding_window: int | None = struct.field(pytree_node=False, default=None)

  @classmethod
  def create(cls, layer: LayerSpec, batch_size: int, capacity: int,
             theta_KxH: jax.Array, head_dim: int, dtype: str = "float32",
             sliding_window: int | None = None) -> FitLayerCache:
    shape = (batch_size, capacity, theta_KxH.shape[0], head_dim)
    return cls(k_BxSxKxH=jnp.zeros(shape, jnp.float32),
               v_BxSxKxH=jnp.zeros(shape, jnp.float32),
               length_B=jnp.zeros((batch_size,), jnp.int32),
               theta_KxH=theta_KxH, capacity=capacity, layer=layer,
               dtype=dtype, sliding_window=sliding_window)

  def _sinks(self, written_BxTxKxH, sink_BxTxKxH, positions_BxT, axis=1):
    """Sink positions take `sink_BxTxKxH` (tokens on `axis`)."""
    if not self.layer.sink or self.sliding_window is not None:
      return written_BxTxKxH
    use_BxT = positions_BxT < self.layer.sink
    use = use_BxT[:, :, None, None] if axis == 1 else use_BxT[:, None, :,
                                                               None]
    return jnp.where(use, sink_BxTxKxH, written_BxTxKxH)

  def _keys(self, k_BxTxKxH, positions_BxT, rope: Rope):
    """Normalised by the stretched range, quantized (sinks: cast to the
    window dtype, as the cache stores them), back, then RoPE."""
    layer = self.layer
    ratio_Kx1xH = jnp.exp(self.theta_KxH)[:, None, :]
    z_BxKxTxH = layer.key_affine.normalize(
        jnp.swapaxes(k_BxTxKxH, 1, 2)) / ratio_Kx1xH
    written = straight_through(z_BxKxTxH, lambda z: fake_quant.round_trip(
        z, layer.k, self.dtype, False), bound=1.0)
    sink = fake_quant.round_trip(z_BxKxTxH, None, self.dtype, False,
                                 window_dtype=layer.window_dtype)
    z_BxKxTxH = self._sinks(written, sink, positions_BxT, axis=2)
    k_hat = layer.key_affine.denormalize(z_BxKxTxH * ratio_Kx1xH)
    return rope(jnp.swapaxes(k_hat, 1, 2), positions_BxT)

  def _values(self, v_BxTxKxH, positions_BxT):
    layer = self.layer
    trip = lambda v, window=None: fake_quant.values(
        v, None if window else layer.v, self.dtype, layer.hadamard_v,
        layer.rotation_key, window)
    written = straight_through(v_BxTxKxH.astype(jnp.float32), trip)
    return self._sinks(written, trip(v_BxTxKxH, layer.window_dtype),
                       positions_BxT)

  def attend(self, q_BxTxNxH, k_BxTxKxH, v_BxTxKxH, positions_BxT,
             rope: Rope):
    return write_and_attend(
        self, q_BxTxNxH, self._keys(k_BxTxKxH, positions_BxT, rope),
        self._values(v_BxTxKxH, positions_BxT), self.sliding_window)


def scored_kl(logits_BxTxV: jax.Array, base_logp_BxPxV: jax.Array,
              first: int) -> jax.Array:
  """Mean KL(base || model) over predictions first..T-2 (the scored ones:
  prediction j reads logits at position j)."""
  logp = jax.nn.log_softmax(
      logits_BxTxV[:, first:-1].astype(jnp.float32), axis=-1)
  return jnp.mean(kl_divergence(base_logp_BxPxV, logp))


class KLFit:
  """`KLFit(decoder, layers, first_scored)`: loss and gradient of the
  scored KL with respect to theta [L, K, H] (or [L, 1, 1]), jitted once."""

  def __init__(self, decoder: Decoder, layers: Sequence[LayerSpec],
               first_scored: int, dtype: str = "float32"):
    config = decoder.config
    if len(layers) != config.num_layers:
      raise ValueError(f"KLFit: {len(layers)} layer specs for a model with "
                       f"num_layers={config.num_layers}.")
    for i, layer in enumerate(layers):
      check_fittable(layer, f"CacheSpec (layer {i})")
    self.config = config
    graphdef, self._state = nnx.split(decoder)

    def logits(theta_LxKxH, state, tokens_BxT):
      model = nnx.merge(graphdef, state)
      b, t = tokens_BxT.shape
      theta = jnp.broadcast_to(theta_LxKxH, (config.num_layers,
                                             config.num_kv_heads,
                                             config.head_dim))
      caches = init_layer_caches(config, lambda i: FitLayerCache.create(
          layers[i], b, t, theta[i], config.head_dim, dtype,
          config.layer_window(i)))
      positions_BxT = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32),
                                       (b, t))
      return model(tokens_BxT, positions_BxT, caches)[0]

    def loss(theta_LxKxH, state, tokens_BxT, base_logp_BxPxV):
      return scored_kl(logits(theta_LxKxH, state, tokens_BxT),
                       base_logp_BxPxV, first_scored)

    self._logits = jax.jit(logits)
    self._loss = jax.jit(loss)
    self._grad = jax.jit(jax.value_and_grad(loss))

  def logits(self, theta, tokens_BxT) -> jax.Array:
    """float32 logits [B, T, V] of fresh windows through the fitted cache."""
    return self._logits(jnp.asarray(theta, jnp.float32), self._state,
                        jnp.asarray(tokens_BxT, jnp.int32))

  def loss(self, theta, tokens_BxT, base_logp_BxPxV) -> float:
    return float(self._loss(theta, self._state, tokens_BxT, base_logp_BxPxV))

  def value_and_grad(self, theta, tokens_BxT, base_logp_BxPxV):
    return self._grad(theta, self._state, tokens_BxT, base_logp_BxPxV)


def base_log_probs(logits_BxTxV, first: int) -> np.ndarray:
  """The full-precision model's log-probabilities at the scored
  predictions, float32 [B, T - 1 - first, V]."""
  return np.asarray(jax.nn.log_softmax(
      jnp.asarray(logits_BxTxV, jnp.float32)[:, first:-1], axis=-1))


@dataclasses.dataclass(frozen=True)
class FitResult:
  """theta_LxKxH: the kept log-ratios (zeros where the fit did not beat
  the calibrated ranges); kl_before / kl_after: mean KL over all
  calibration windows at theta = 0 and at the fitted theta; losses: the
  per-step training KL; kept: whether the fitted theta was kept."""

  theta_LxKxH: np.ndarray
  kl_before: float
  kl_after: float
  losses: tuple[float, ...]
  kept: bool


def fit_theta(fit: KLFit, tokens_WxT: np.ndarray, base_logp_WxPxV,
              options: KLFitOptions = KLFitOptions(),
              progress: Callable[[int, float], None] | None = None
              ) -> FitResult:
  """Adam on theta, one window per step (cycling over the W windows);
  keeps the result only if its mean KL over all W windows is lower than at
  theta = 0."""
  config = fit.config
  shape = ((config.num_layers, config.num_kv_heads, config.head_dim)
           if options.granularity == "channel" else (config.num_layers, 1, 1))
  theta = jnp.zeros(shape, jnp.float32)

  def mean_kl(theta):
    return float(np.mean([fit.loss(theta, tokens_WxT[w:w + 1],
                                   base_logp_WxPxV[w:w + 1])
                          for w in range(len(tokens_WxT))]))

  kl_before = mean_kl(theta)
  optimizer = optax.adam(options.learning_rate)
  state = optimizer.init(theta)
  losses = []
  for step in range(options.steps):
    w = step % len(tokens_WxT)
    value, grad = fit.value_and_grad(theta, tokens_WxT[w:w + 1],
                                     base_logp_WxPxV[w:w + 1])
    updates, state = optimizer.update(grad, state, theta)
    theta = optax.apply_updates(theta, updates)
    losses.append(float(value))
    if progress is not None:
      progress(step, float(value))
  kl_after = mean_kl(theta)
  kept = kl_after < kl_before
  full = np.broadcast_to(np.asarray(theta), (
      config.num_layers, config.num_kv_heads, config.head_dim))
  return FitResult(theta_LxKxH=full if kept else np.zeros_like(full),
                   kl_before=kl_before, kl_after=kl_after,
                   losses=tuple(losses), kept=kept)


def fitted_affines(affines: Sequence[KeyAffine], theta_LxKxH: np.ndarray
                   ) -> tuple[KeyAffine, ...]:
  """The range-mode affines with scale s * exp(theta) (shift, codebooks and
  rotation unchanged)."""
  return tuple(
      KeyAffine.from_arrays(a.arrays()[0],
                            a.arrays()[1] * np.exp(np.asarray(t, np.float32)),
                            mode=a.mode, codebooks=a.codebooks,
                            rotation_KxHxH=a.rotation_array())
      for a, t in zip(affines, theta_LxKxH))
