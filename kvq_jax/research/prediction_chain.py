"""Cross-layer prediction through a real quantizer, net of its constants
(issue 34, method 4, measured before it is built into the cache).

`dependence.ridge_bits` gives a Gaussian bound from exact or round-tripped
inputs. A cache that predicts layer l from layer l-1 can only use what it
reconstructed of layer l-1, which was itself predicted from layer l-2: the
errors chain. `chain_gain` runs that chain on recorded keys and values,
layer by layer, the way a cache would (AQUA-KV's pairing):

  K_l^ = P_K(K_{l-1}^) + Q(K_l - P_K(K_{l-1}^))
  V_l^ = P_V(K_l^, V_{l-1}^) + Q(V_l - P_V(K_l^, V_{l-1}^))

with ridge predictors P (intercept; fitted on the first `train_frac` of the
tokens from the chain's own reconstructions, target exact) and the same
quantizer Q that would otherwise code K_l and V_l directly. Q always sees
standardized rows: each channel's mean and standard deviation (from the
training rows of whatever it codes) are taken out before and put back
after, as static per-channel ranges do in our ca formats. Without that,
the predictor's intercept alone would "gain" what removing the keys'
large per-channel offsets gains (`k_unstandardized` keeps that
comparison). Layer 0 is coded directly. A third, chain-free variant predicts values from this
layer's reconstructed keys only (`v_from_k`: V_l^ = P(K_l^) + Q(V_l - P)),
which needs nothing from another layer at decode.

Predictor shapes: `full` takes every kv head of the input as one vector per
target head; `head` only the target's own kv head (K H x H; V 2H x H).

Reported per layer: held-out MSE of direct coding and of each predicted
variant, the gain in equivalent bits 0.5 log2(MSE_direct / MSE_pred), and
the predictor's parameter count, whose storage `constant_bits` charges per
cached element at a context, as the effective bits charge every per-layer
constant. All numpy, float64, except Q (the caller's quantizer).
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from kvq_jax.research.dependence import fit_ridge

SHAPES = ("full", "head")


def predictor_params(shape: str, num_kv_heads: int, head_dim: int) -> dict:
  """Parameters (weights + intercepts) per layer of each predictor (the
  residual's per-channel mean and deviation replace the direct code's, so
  they add nothing)."""
  if shape not in SHAPES:
    raise ValueError(f"prediction_chain: shape {shape!r}; allowed: {SHAPES}.")
  k_in = head_dim * (num_kv_heads if shape == "full" else 1)
  per_head = {"k": k_in * head_dim + head_dim,
              "v": 2 * k_in * head_dim + head_dim,
              "v_from_k": k_in * head_dim + head_dim}
  return {name: num_kv_heads * n for name, n in per_head.items()}


def constant_bits(params: int, context: int, num_kv_heads: int,
                  head_dim: int, dtype_bits: int = 16) -> float:
  """Bits per cached element of one layer's K and V (2 K H per token) that
  `params` stored constants add at `context` tokens."""
  return params * dtype_bits / (context * 2 * num_kv_heads * head_dim)


def _gain(direct: float, pred: float) -> float:
  return 0.5 * float(np.log2(direct / pred))


def _inputs(shape: str, kv: int, *blocks_NxKxH: np.ndarray) -> np.ndarray:
  """The predictor's input rows for target head `kv`."""
  if shape == "full":
    return np.concatenate([b.reshape(len(b), -1) for b in blocks_NxKxH],
                          axis=1)
  return np.concatenate([b[:, kv] for b in blocks_NxKxH], axis=1)


def standardized(quantize, x_NxH: np.ndarray, n_train: int) -> np.ndarray:
  """mu + sd * Q((x - mu) / sd), per channel, mu and sd from the first
  n_train rows (constant channels keep sd 1)."""
  mu = x_NxH[:n_train].mean(axis=0)
  sd = x_NxH[:n_train].std(axis=0)
  sd = np.where(sd > 0, sd, 1.0)
  return mu + sd * np.asarray(quantize((x_NxH - mu) / sd), np.float64)


def _predict_code(x_in_NxD, y_NxH, n_train, lam, quantize):
  """Fit on the first n_train rows, predict all, code the residual."""
  w, mx, my = fit_ridge(x_in_NxD[:n_train], y_NxH[:n_train], lam)
  pred = (x_in_NxD - mx) @ w + my
  return pred + standardized(quantize, y_NxH - pred, n_train)


def chain_gain(layers: list[tuple[np.ndarray, np.ndarray]],
               quantize: Callable[[np.ndarray], np.ndarray],
               shape: str = "full", train_frac: float = 0.75,
               lam: float = 1e-3) -> list[dict]:
  """The chain of the module docstring over `layers` = [(k_NxKxH, v_NxKxH)
  exact pre-RoPE keys and values per layer]; `quantize` round-trips rows of
  one head (N x H). One dict per layer: MSE on the held-out rows of direct
  coding (`k_direct`, `v_direct`) and of the chain (`k_chain`, `v_chain`,
  layer 0 = direct) and `v_from_k`, with gains in bits."""
  if shape not in SHAPES:
    raise ValueError(f"prediction_chain: shape {shape!r}; allowed: {SHAPES}.")
  n = len(layers[0][0])
  n_train = int(n * train_frac)
  if not 0 < n_train < n:
    raise ValueError(f"prediction_chain: {n} rows, train_frac {train_frac}:"
                     " need rows on both sides.")
  test = slice(n_train, None)
  mse = lambda a, b: float(np.mean((a[test] - b[test]) ** 2))
  out, prev = [], None
  for layer, (k, v) in enumerate(layers):
    k, v = np.asarray(k, np.float64), np.asarray(v, np.float64)
    heads = range(k.shape[1])
    k_dir = np.stack([standardized(quantize, k[:, h], n_train)
                      for h in heads], axis=1)
    v_dir = np.stack([standardized(quantize, v[:, h], n_train)
                      for h in heads], axis=1)
    k_raw = np.stack([quantize(k[:, h]) for h in heads], axis=1)
    if prev is None:
      k_hat, v_hat = k_dir, v_dir
    else:
      k_hat = np.stack([_predict_code(_inputs(shape, h, prev[0]), k[:, h],
                                      n_train, lam, quantize)
                        for h in heads], axis=1)
      v_hat = np.stack([_predict_code(_inputs(shape, h, k_hat, prev[1]),
                                      v[:, h], n_train, lam, quantize)
                        for h in heads], axis=1)
    v_fk = np.stack([_predict_code(_inputs(shape, h, k_dir), v[:, h],
                                   n_train, lam, quantize)
                     for h in heads], axis=1)
    row = {"layer": layer,
           "k_direct": mse(k, k_dir), "v_direct": mse(v, v_dir),
           "k_chain": mse(k, k_hat), "v_chain": mse(v, v_hat),
           "v_from_k": mse(v, v_fk), "k_unstandardized": mse(k, k_raw)}
    for name in ("k_chain", "v_chain"):
      row[name + "_bits"] = _gain(row[name[0] + "_direct"], row[name])
    row["v_from_k_bits"] = _gain(row["v_direct"], row["v_from_k"])
    row["k_standardize_bits"] = _gain(row["k_unstandardized"],
                                      row["k_direct"])
    out.append(row)
    prev = (k_hat, v_hat)
  return out


def net_bits(rows: list[dict], params: dict, context: int,
             num_kv_heads: int, head_dim: int,
             dtype_bits: int = 16) -> dict:
  """Model means per cached element (K and V counted equally) of what the
  chain and v_from_k buy, what their predictors cost at `context`, and the
  difference; layer 0 has no predictor and buys nothing."""
  layers = len(rows)
  chain_gain_bits = np.mean([0.5 * (r["k_chain_bits"] + r["v_chain_bits"])
                             for r in rows])
  fk_gain_bits = np.mean([0.5 * r["v_from_k_bits"] for r in rows])
  cost = lambda p: (constant_bits(p, context, num_kv_heads, head_dim,
                                  dtype_bits) * (layers - 1) / layers)
  chain_cost = cost(params["k"] + params["v"])
  fk_cost = constant_bits(params["v_from_k"], context, num_kv_heads,
                          head_dim, dtype_bits)
  return {"context": context,
          "chain_gain": float(chain_gain_bits), "chain_cost": chain_cost,
          "chain_net": float(chain_gain_bits) - chain_cost,
          "v_from_k_gain": float(fk_gain_bits), "v_from_k_cost": fk_cost,
          "v_from_k_net": float(fk_gain_bits) - fk_cost}
