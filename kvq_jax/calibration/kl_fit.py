"""KL-objective calibration of static keys (ranges, codebooks, rotations),
end to end with optax.

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
`cache.round_trip` does (sinks included; `FitLayerCache`), with the
rounding made differentiable by the straight-through estimator (identity
inside the range [-1, 1] and for kept outliers, zero for clipped values;
LSQ's): the gradient of a reconstructed key s * exp(theta) * q(z) with
respect to exp(theta) is s (q(z) - z) inside the range and s q(z) for a
clipped one, so the fit trades clipping against rounding error where the
model's output says it matters. Values, whose format is not fitted, pass
their rounding the same way so that gradients reach earlier layers through
them.

Two more things can be learned with the ranges, or instead of them
(`KLFitOptions.fit`):

* "codebook": each layer's 2^b static-key levels c (starting from the
  stats' codebook or the uniform levels): a key rounds to its nearest level
  and reads back c[u], so d(read-back)/dc flows through the gather
  (`straight_through.static_codebook_round_trip`); the levels are kept
  sorted after every step.
* "rotation": per layer and kv head an orthogonal R = skew_exp(A) R0 (R0 the
  stats' rotation or the identity, A = 0 at the start), the stored key
  being R (k - mu) / s as in `KeyAffine`; R is written to the stats and
  charged as float32 [K, H, H] per layer like a calibrated rotation.

The result is written as ordinary range-mode key stats (scale s *
exp(theta), codebooks, rotation; `key_stats_store`), so any preset loads
it with `cache.key_stats=DIR` and the cache itself is unchanged.
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
from kvq_jax.cache import round_trip
from kvq_jax.cache.dense import write_and_attend
from kvq_jax.cache.key_affine import KeyAffine
from kvq_jax.cache.spec import LayerSpec
from kvq_jax.calibration.straight_through import (skew_exp,
                                                  static_codebook_round_trip,
                                                  straight_through,
                                                  uniform_levels)
from kvq_jax.eval.token_metrics import kl_divergence
from kvq_jax.models.decoder import Decoder
from kvq_jax.models.rope import Rope

GRANULARITIES = ("channel", "layer")
TARGETS = ("range", "codebook", "rotation")


@dataclasses.dataclass(frozen=True)
class KLFitOptions:
  """steps: Adam steps, one calibration window each (cycling);
  learning_rate: Adam's, on every fitted parameter; granularity: "channel"
  (theta per layer, kv head and channel) or "layer" (one theta per layer);
  fit: what is learned, any of "range" (the log-ratios theta), "codebook"
  (each layer's 2^b static-key levels) and "rotation" (each layer's and kv
  head's orthogonal R, `straight_through.skew_exp` on top of the stats' own
  R or the identity)."""

  steps: int = 32
  learning_rate: float = 0.01
  granularity: str = "layer"
  fit: tuple[str, ...] = ("range",)

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
    fit = tuple(self.fit)
    if not fit or any(t not in TARGETS for t in fit) or len(set(fit)) != len(
        fit):
      raise ValueError(f"KLFitOptions.fit={self.fit!r}: allowed: a non-empty "
                       f"set of {', '.join(TARGETS)}.")
    object.__setattr__(self, "fit", tuple(t for t in TARGETS if t in fit))


def check_fittable(layer: LayerSpec, where: str) -> None:
  """ValueError unless `layer` stores static keys in calibrated ranges and
  is emulated exactly at write time (`round_trip.check_emulable`)."""
  round_trip.check_emulable(layer, where)
  affine = layer.key_affine
  if (layer.k is None or layer.k.scheme != "static" or affine is None
      or affine.mode != "range" or layer.key_rope != "pre"):
    raise ValueError(
        f"{where}: the KL fit learns the calibrated ranges of static keys; "
        "allowed: k with scheme='static', key_rope='pre' and range-mode key "
        "stats (experiments.calibrate_keys --mode=range), e.g. --config=kq4.")


def start_levels(layer: LayerSpec) -> np.ndarray:
  """The static keys' levels the codebook fit starts from: the stats'
  codebook when the layer has one, else the uniform levels."""
  if layer.k.levels:
    return np.asarray(layer.k.levels, np.float32)
  return np.asarray(uniform_levels(layer.k))


@struct.dataclass
class FitLayerCache:
  """Post-RoPE K/V [B, S, K, H] in float32, written through the layer's
  formats with the key range stretched by exp(theta_KxH), the static keys
  rounded to `levels_C` and rotated by `rotation_KxHxH` where given (else
  the layer's own)."""

  k_BxSxKxH: jax.Array
  v_BxSxKxH: jax.Array
  length_B: jax.Array
  theta_KxH: jax.Array
  levels_C: jax.Array | None
  rotation_KxHxH: jax.Array | None
  capacity: int = struct.field(pytree_node=False)
  layer: LayerSpec = struct.field(pytree_node=False)
  dtype: str = struct.field(pytree_node=False)
  sliding_window: int | None = struct.field(pytree_node=False, default=None)

  @classmethod
  def create(cls, layer: LayerSpec, batch_size: int, capacity: int,
             theta_KxH: jax.Array, head_dim: int, dtype: str = "float32",
             sliding_window: int | None = None, levels_C=None,
             rotation_KxHxH=None) -> FitLayerCache:
    shape = (batch_size, capacity, theta_KxH.shape[0], head_dim)
    return cls(k_BxSxKxH=jnp.zeros(shape, jnp.float32),
               v_BxSxKxH=jnp.zeros(shape, jnp.float32),
               length_B=jnp.zeros((batch_size,), jnp.int32),
               theta_KxH=theta_KxH, levels_C=levels_C,
               rotation_KxHxH=rotation_KxHxH, capacity=capacity, layer=layer,
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
    layer, rotation = self.layer, self.rotation_KxHxH
    ratio_Kx1xH = jnp.exp(self.theta_KxH)[:, None, :]
    z_BxKxTxH = layer.key_affine.normalize(
        jnp.swapaxes(k_BxTxKxH, 1, 2), rotation) / ratio_Kx1xH
    if self.levels_C is None:
      written = straight_through(z_BxKxTxH, lambda z: round_trip.round_trip(
          z, layer.k, self.dtype, False), bound=1.0)
    else:
      written = static_codebook_round_trip(z_BxKxTxH, self.levels_C, layer.k,
                                           self.dtype)
    sink = round_trip.round_trip(z_BxKxTxH, None, self.dtype, False,
                                 window_dtype=layer.window_dtype)
    z_BxKxTxH = self._sinks(written, sink, positions_BxT, axis=2)
    k_hat = layer.key_affine.denormalize(z_BxKxTxH * ratio_Kx1xH, rotation)
    return rope(jnp.swapaxes(k_hat, 1, 2), positions_BxT)

  def _values(self, v_BxTxKxH, positions_BxT):
    layer = self.layer
    trip = lambda v, window=None: round_trip.values(
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


def initial_params(config, options: KLFitOptions,
                   layers: Sequence[LayerSpec]) -> dict:
  """The fit's starting point (the stats as calibrated): theta 0
  ([L, K, H] or [L, 1, 1]), with "codebook" the start levels per layer,
  with "rotation" A = 0 per layer ([L, K, H, H])."""
  shape = ((config.num_layers, config.num_kv_heads, config.head_dim)
           if options.granularity == "channel" else (config.num_layers, 1, 1))
  params = {"theta": jnp.zeros(shape, jnp.float32)}
  if "codebook" in options.fit:
    params["levels"] = tuple(jnp.asarray(start_levels(layer))
                             for layer in layers)
  if "rotation" in options.fit:
    params["skew"] = jnp.zeros((config.num_layers, config.num_kv_heads,
                                config.head_dim, config.head_dim),
                               jnp.float32)
  return params


class KLFit:
  """`KLFit(decoder, layers, first_scored)`: logits, loss and gradient of
  the scored KL with respect to the fit's parameters (`initial_params`: a
  dict with "theta" [L, K, H] or [L, 1, 1] and optionally "levels" (one
  [2^b] array per layer) and "skew" [L, K, H, H]), jitted once per set."""

  def __init__(self, decoder: Decoder, layers: Sequence[LayerSpec],
               first_scored: int, dtype: str = "float32"):
    config = decoder.config
    if len(layers) != config.num_layers:
      raise ValueError(f"KLFit: {len(layers)} layer specs for a model with "
                       f"num_layers={config.num_layers}.")
    for i, layer in enumerate(layers):
      check_fittable(layer, f"CacheSpec (layer {i})")
    self.config, self.layers = config, tuple(layers)
    graphdef, self._state = nnx.split(decoder)

    def logits(params, state, tokens_BxT):
      model = nnx.merge(graphdef, state)
      b, t = tokens_BxT.shape
      theta = jnp.broadcast_to(params["theta"], (config.num_layers,
                                                 config.num_kv_heads,
                                                 config.head_dim))
      levels = params.get("levels")
      rotations = self.rotations(params)
      caches = init_layer_caches(config, lambda i: FitLayerCache.create(
          layers[i], b, t, theta[i], config.head_dim, dtype,
          config.layer_window(i),
          levels_C=None if levels is None else levels[i],
          rotation_KxHxH=None if rotations is None else rotations[i]))
      positions_BxT = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32),
                                       (b, t))
      return model(tokens_BxT, positions_BxT, caches)[0]

    def loss(params, state, tokens_BxT, base_logp_BxPxV):
      return scored_kl(logits(params, state, tokens_BxT),
                       base_logp_BxPxV, first_scored)

    self._logits = jax.jit(logits)
    self._loss = jax.jit(loss)
    self._grad = jax.jit(jax.value_and_grad(loss))

  def rotations(self, params) -> list | None:
    """Per layer the rotation the fit applies, skew_exp(A) R0 (R0 the
    layer's own or the identity); None without "skew"."""
    if "skew" not in params:
      return None
    out = []
    for layer, skew in zip(self.layers, params["skew"]):
      own = layer.key_affine.rotation_array()
      turn = skew_exp(skew)
      out.append(turn if own is None else jnp.einsum(
          "kab,kbc->kac", turn, own, precision=jax.lax.Precision.HIGHEST))
    return out

  @staticmethod
  def _params(params) -> dict:
    if not isinstance(params, dict):  # a bare theta
      params = {"theta": params}
    return jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), params)

  def logits(self, params, tokens_BxT) -> jax.Array:
    """float32 logits [B, T, V] of fresh windows through the fitted cache
    (`params`: the dict, or theta alone)."""
    return self._logits(self._params(params), self._state,
                        jnp.asarray(tokens_BxT, jnp.int32))

  def loss(self, params, tokens_BxT, base_logp_BxPxV) -> float:
    return float(self._loss(self._params(params), self._state, tokens_BxT,
                            base_logp_BxPxV))

  def value_and_grad(self, params, tokens_BxT, base_logp_BxPxV):
    return self._grad(self._params(params), self._state, tokens_BxT,
                      base_logp_BxPxV)


def base_log_probs(logits_BxTxV, first: int) -> np.ndarray:
  """The full-precision model's log-probabilities at the scored
  predictions, float32 [B, T - 1 - first, V]."""
  return np.asarray(jax.nn.log_softmax(
      jnp.asarray(logits_BxTxV, jnp.float32)[:, first:-1], axis=-1))


@dataclasses.dataclass(frozen=True)
class FitResult:
  """theta_LxKxH: the kept log-ratios (zeros where the fit did not beat
  the calibrated stats); levels: the kept per-layer static-key levels
  (None: the stats' own); rotation_LxKxHxH: the kept per-layer rotations
  (None: the stats' own); kl_before / kl_after: mean KL over all
  calibration windows at the start and at the fitted parameters; losses:
  the per-step training KL; kept: whether the fit was kept."""

  theta_LxKxH: np.ndarray
  kl_before: float
  kl_after: float
  losses: tuple[float, ...]
  kept: bool
  levels: tuple[np.ndarray, ...] | None = None
  rotation_LxKxHxH: np.ndarray | None = None


def fit_params(fit: KLFit, tokens_WxT: np.ndarray, base_logp_WxPxV,
               options: KLFitOptions = KLFitOptions(),
               progress: Callable[[int, float], None] | None = None
               ) -> FitResult:
  """Adam on what `options.fit` names, one window per step (cycling over
  the W windows; levels re-sorted after each step); keeps the result only
  if its mean KL over all W windows is lower than at the start."""
  config = fit.config
  params = initial_params(config, options, fit.layers)
  fitted = {"theta"} if "range" in options.fit else set()
  fitted |= set(params) - {"theta"}

  def mean_kl(params):
    return float(np.mean([fit.loss(params, tokens_WxT[w:w + 1],
                                   base_logp_WxPxV[w:w + 1])
                          for w in range(len(tokens_WxT))]))

  kl_before = mean_kl(params)
  optimizer = optax.multi_transform(
      {"fit": optax.adam(options.learning_rate),
       "fixed": optax.set_to_zero()},
      {k: jax.tree.map(lambda _, k=k: "fit" if k in fitted else "fixed", v)
       for k, v in params.items()})
  state = optimizer.init(params)
  losses = []
  for step in range(options.steps):
    w = step % len(tokens_WxT)
    value, grad = fit.value_and_grad(params, tokens_WxT[w:w + 1],
                                     base_logp_WxPxV[w:w + 1])
    updates, state = optimizer.update(grad, state, params)
    params = optax.apply_updates(params, updates)
    if "levels" in params:
      params["levels"] = tuple(jnp.sort(c) for c in params["levels"])
    losses.append(float(value))
    if progress is not None:
      progress(step, float(value))
  kl_after = mean_kl(params)
  kept = kl_after < kl_before
  theta = np.broadcast_to(np.asarray(params["theta"]), (
      config.num_layers, config.num_kv_heads, config.head_dim))
  levels = rotations = None
  if kept and "levels" in params:
    levels = tuple(np.asarray(c) for c in params["levels"])
  if kept and "skew" in params:
    rotations = np.stack([np.asarray(r) for r in fit.rotations(params)])
  return FitResult(theta_LxKxH=theta if kept else np.zeros_like(theta),
                   kl_before=kl_before, kl_after=kl_after,
                   losses=tuple(losses), kept=kept, levels=levels,
                   rotation_LxKxHxH=rotations)


def fitted_affines(affines: Sequence[KeyAffine], theta_LxKxH: np.ndarray,
                   layers: Sequence[LayerSpec] | None = None,
                   levels: Sequence[np.ndarray] | None = None,
                   rotation_LxKxHxH: np.ndarray | None = None
                   ) -> tuple[KeyAffine, ...]:
  """The range-mode affines with scale s * exp(theta); with `levels` (and
  the `layers` whose static-key bits they are for) those as codebooks;
  with `rotation_LxKxHxH` those as rotations (else each affine's own
  codebooks and rotation)."""
  out = []
  for i, (a, t) in enumerate(zip(affines, theta_LxKxH)):
    books = a.codebooks
    if levels is not None:
      books = {**dict(books), layers[i].k.bits: np.asarray(levels[i])}
    rotation = (a.rotation_array() if rotation_LxKxHxH is None
                else rotation_LxKxHxH[i])
    out.append(KeyAffine.from_arrays(
        a.arrays()[0], a.arrays()[1] * np.exp(np.asarray(t, np.float32)),
        mode=a.mode, codebooks=books, rotation_KxHxH=rotation))
  return tuple(out)
