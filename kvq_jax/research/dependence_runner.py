"""`experiments.dependence`' library call: per layer and kv head, how much
the scalar formats leave in the dependence between channels, inside small
channel groups and between layers (`research.dependence`).

1. Calibration windows: the last `num_calib_windows` windows of the text,
   disjoint from the evaluation windows (`calibration.key_runner`'s split,
   asserted); every layer's queries, pre-RoPE keys and values recorded from
   the full-precision model.
2. Per layer and kv head (tokens of all windows as rows):
   - transform coding at `rate` bits per coordinate, pre-RoPE keys and
     values, plain MSE and an attention-weighted metric: for keys the
     group's query second moments averaged over each RoPE pair (the metric
     a uniformly spread relative phase leaves: diagonal, pair-tied); for
     values sum_n W_o[n] W_o[n]^T over the group's query heads n (the
     error's cost after the output projection);
   - ridge prediction from the previous layer (layer >= 1): keys from its
     pre-RoPE keys, values from this layer's keys and its values (the
     AQUA-KV pairing), fitted on the first 3/4 of the tokens; from the
     exact inputs and again, per `ridge_input_bits`, from their
     `ridge_spec` round trip (the reconstruction a cache would predict
     from; the target stays exact);
   - the cross-layer prediction chain through the int-B g32 quantizer
     itself, per `ridge_input_bits` and predictor shape, net of the
     predictors' bfloat16 constants at each of `chain_contexts`
     (`research.prediction_chain`);
   - k-means against per-channel Lloyd-Max at equal rate, for each
     (group dim, rate) in `vq_grid`, on every `vq_layer_stride`-th layer
     (k-means of 256 entries per group is the slow part).
3. dependence.json (every number), dependence.md (per-layer means over
   heads and the model mean) and config.json in `workdir`.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import time

import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import logging

from kvq_jax.bench.timing import machine_description
from kvq_jax.calibration.key_runner import calibration_inputs
from kvq_jax.calibration.recording import record_qkv
from kvq_jax.cache.round_trip import quantize_dequantize
from kvq_jax.quant.spec import QuantSpec
from kvq_jax.research import dependence, prediction_chain


@dataclasses.dataclass(frozen=True)
class DependenceOptions:
  """What to measure; see the module docstring."""

  rate: float = 2.5
  num_calib_windows: int = 8
  vq_grid: tuple[tuple[int, int], ...] = ((2, 1), (2, 2), (4, 1), (4, 2),
                                          (8, 1))
  vq_layer_stride: int = 3
  ridge_lambda: float = 1e-3
  ridge_input_bits: tuple[int, ...] = (4, 2)
  chain_contexts: tuple[int, ...] = (512, 4096)

  def __post_init__(self):
    for bits in self.ridge_input_bits:
      try:
        ridge_spec(bits)
      except ValueError as e:
        raise ValueError(f"dependence: ridge_input_bits entry {bits}: {e}"
                         ) from e
    if any(c < 1 for c in self.chain_contexts):
      raise ValueError(f"dependence: chain_contexts {self.chain_contexts}; "
                       "allowed: positive token counts.")
    if self.rate <= 0:
      raise ValueError(f"dependence: rate {self.rate}; allowed: > 0.")
    if self.num_calib_windows < 1 or self.vq_layer_stride < 1:
      raise ValueError("dependence: num_calib_windows and vq_layer_stride "
                       "must be >= 1.")
    for dim, rate in self.vq_grid:
      if dim < 1 or rate < 1 or 2 ** (dim * rate) > 256:
        raise ValueError(
            f"dependence: vq_grid entry ({dim}, {rate}); allowed: dim, rate "
            ">= 1 with at most 2^8 codebook entries (dim * rate <= 8).")


def key_metric(q_NxGxH: np.ndarray, rotary_dim: int) -> np.ndarray:
  """Diagonal metric for pre-RoPE keys: E[q_i^2] over the group's query
  heads and tokens, averaged within each RoPE pair (i, i + rotary_dim/2);
  channels past rotary_dim keep their own."""
  m = np.mean(np.asarray(q_NxGxH, np.float64) ** 2, axis=(0, 1))
  half = rotary_dim // 2
  pair = 0.5 * (m[:half] + m[half:rotary_dim])
  m = m.copy()
  m[:half], m[half:rotary_dim] = pair, pair
  return np.diag(m)


def value_metric(o_kernel_NHxD: np.ndarray, heads: range,
                 head_dim: int) -> np.ndarray:
  """sum over query heads n of W_o[n] W_o[n]^T (W_o[n]: rows of head n)."""
  w = np.asarray(o_kernel_NHxD, np.float64)
  out = np.zeros((head_dim, head_dim))
  for n in heads:
    block = w[n * head_dim:(n + 1) * head_dim]
    out += block @ block.T
  return out


def _rows(x_BxTxKxH: np.ndarray, kv: int | None = None) -> np.ndarray:
  x = np.asarray(x_BxTxKxH, np.float64)
  if kv is None:
    return x.reshape(-1, x.shape[2] * x.shape[3])
  return x[:, :, kv].reshape(-1, x.shape[3])


def ridge_spec(bits: int) -> QuantSpec:
  """The int-`bits` asymmetric g32 format (groups along head_dim, so never
  across heads) whose reconstruction the ridge predictor is fitted from."""
  return QuantSpec(format=f"int{bits}", scheme="asymmetric",
                   granularity="per_group", group_size=32)


def round_trip(x_NxD: np.ndarray, bits: int | None) -> np.ndarray:
  """x itself (bits None) or its `ridge_spec(bits)` round trip."""
  if bits is None:
    return x_NxD
  out = quantize_dequantize(jnp.asarray(x_NxD, jnp.float32), ridge_spec(bits))
  return np.asarray(out, np.float64)


def reconstructions(rec, options: DependenceOptions) -> dict:
  """One layer's pre-RoPE keys and values (all kv heads as columns), per
  input variant: '' exact, '_intB' round-tripped."""
  k, v = _rows(rec.k_pre_BxTxKxH), _rows(rec.v_BxTxKxH)
  return {("" if bits is None else f"_int{bits}"):
          (round_trip(k, bits), round_trip(v, bits))
          for bits in (None,) + tuple(options.ridge_input_bits)}


def o_kernels(lm) -> list[np.ndarray]:
  return [np.asarray(block.attn.o.kernel[...], np.float64)
          for block in lm.decoder.layers]


def measure(lm, records, options: DependenceOptions) -> list[dict]:
  """Step 2 of the module docstring: one row per (layer, kv head)."""
  cfg = lm.config
  group = cfg.num_heads // cfg.num_kv_heads
  kernels = o_kernels(lm)
  rows = []
  prev_recon = {}
  for layer, rec in enumerate(records):
    vq_here = layer % options.vq_layer_stride == 0
    recon = reconstructions(rec, options)
    # The key predictor's input: the previous layer's keys; the value
    # predictor's: this layer's keys beside the previous layer's values.
    inputs = {suffix: (k_prev, np.concatenate([recon[suffix][0], v_prev],
                                              axis=1))
              for suffix, (k_prev, v_prev) in prev_recon.items()}
    prev_recon = recon
    for kv in range(cfg.num_kv_heads):
      heads = range(kv * group, (kv + 1) * group)
      k, v = _rows(rec.k_pre_BxTxKxH, kv), _rows(rec.v_BxTxKxH, kv)
      q = np.asarray(rec.q_BxTxNxH[:, :, heads.start:heads.stop],
                     np.float64).reshape(-1, group, cfg.head_dim)
      row = {"layer": layer, "kv_head": kv,
             "k_plain": dependence.transform_gain(k, options.rate),
             "k_weighted": dependence.transform_gain(
                 k, options.rate, key_metric(q, cfg.rotary_dim)),
             "v_plain": dependence.transform_gain(v, options.rate),
             "v_weighted": dependence.transform_gain(
                 v, options.rate,
                 value_metric(kernels[layer], heads, cfg.head_dim))}
      for suffix, (k_in, v_in) in inputs.items():
        row[f"k_ridge{suffix}"] = dependence.ridge_bits(
            k_in, k, lam=options.ridge_lambda)
        row[f"v_ridge{suffix}"] = dependence.ridge_bits(
            v_in, v, lam=options.ridge_lambda)
      if vq_here:
        for name, x in (("k", k), ("v", v)):
          for dim, rate in options.vq_grid:
            row[f"{name}_vq_d{dim}_r{rate}"] = dependence.vq_vs_scalar(
                x, dim, rate)
      rows.append(row)
    logging.info("dependence: layer %d done", layer)
  return rows


def measure_chain(lm, records, options: DependenceOptions) -> dict:
  """Step 2's prediction chain: {'int{B}_{shape}': {'rows', 'net'}}."""
  cfg = lm.config
  layers = [(np.asarray(r.k_pre_BxTxKxH, np.float64).reshape(
                 -1, cfg.num_kv_heads, cfg.head_dim),
             np.asarray(r.v_BxTxKxH, np.float64).reshape(
                 -1, cfg.num_kv_heads, cfg.head_dim)) for r in records]
  out = {}
  for bits in options.ridge_input_bits:
    for shape in prediction_chain.SHAPES:
      if shape == "head" and cfg.num_kv_heads == 1:
        continue  # The same predictor as "full".
      rows = prediction_chain.chain_gain(
          layers, lambda x, b=bits: round_trip(x, b), shape=shape,
          lam=options.ridge_lambda)
      params = prediction_chain.predictor_params(shape, cfg.num_kv_heads,
                                                 cfg.head_dim)
      out[f"int{bits}_{shape}"] = {
          "bits": bits, "shape": shape, "params_per_layer": params,
          "rows": rows,
          "net": [prediction_chain.net_bits(rows, params, c,
                                            cfg.num_kv_heads, cfg.head_dim)
                  for c in options.chain_contexts]}
      logging.info("dependence: chain int%d %s done", bits, shape)
  return out


def chain_markdown(chain: dict) -> str:
  """One row per (quantizer, predictor shape): gains, costs, net."""
  contexts = [n["context"] for n in next(iter(chain.values()))["net"]]
  head = ("| quantizer | predictor | K chain bits | V chain bits | "
          "V from own K bits | "
          + " | ".join(f"chain cost / net @{c}" for c in contexts) + " | "
          + " | ".join(f"V-from-K cost / net @{c}" for c in contexts) + " |")
  lines = [head, "|---" * (5 + 2 * len(contexts)) + "|"]
  for entry in chain.values():
    rows = entry["rows"]
    mean = lambda key: float(np.mean([r[key] for r in rows[1:]] or [0.0]))
    cells = [f"int{entry['bits']} g32", entry["shape"],
             _fmt(mean("k_chain_bits")), _fmt(mean("v_chain_bits")),
             _fmt(float(np.mean([r["v_from_k_bits"] for r in rows])))]
    cells += [f"{n['chain_cost']:.2f} / {n['chain_net']:+.2f}"
              for n in entry["net"]]
    cells += [f"{n['v_from_k_cost']:.2f} / {n['v_from_k_net']:+.2f}"
              for n in entry["net"]]
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines)


def _mean(rows, key, field):
  vals = [r[key][field] for r in rows if key in r and r[key][field] is not None]
  return float(np.mean(vals)) if vals else None


def summary_columns(options: DependenceOptions) -> list[tuple[str, str, str]]:
  """(column title, row key, field) of the markdown tables."""
  cols = [("K PCA bits", "k_plain", "pca_bits"),
          ("K PCA bits (q-weighted)", "k_weighted", "pca_bits"),
          ("K alloc-only bits", "k_plain", "native_alloc_bits"),
          ("V PCA bits", "v_plain", "pca_bits"),
          ("V PCA bits (W_o-weighted)", "v_weighted", "pca_bits"),
          ("K ridge bits", "k_ridge", "bits"),
          ("V ridge bits", "v_ridge", "bits")]
  for bits in options.ridge_input_bits:
    cols += [(f"K ridge bits (int{bits} inputs)", f"k_ridge_int{bits}",
              "bits"),
             (f"V ridge bits (int{bits} inputs)", f"v_ridge_int{bits}",
              "bits")]
  for name in ("k", "v"):
    for dim, rate in options.vq_grid:
      cols.append((f"{name.upper()} VQ d{dim} r{rate} bits",
                   f"{name}_vq_d{dim}_r{rate}", "gain_bits"))
  return cols


def _fmt(x):
  return "" if x is None else f"{x:+.2f}"


def summary_markdown(rows: list[dict], options: DependenceOptions) -> str:
  """The model mean, then per-layer means over kv heads."""
  cols = summary_columns(options)
  head = "| layer | " + " | ".join(c[0] for c in cols) + " |"
  rule = "|---" * (len(cols) + 1) + "|"
  lines = [head, rule,
           "| **all** | " + " | ".join(_fmt(_mean(rows, k, f))
                                      for _, k, f in cols) + " |"]
  for layer in sorted({r["layer"] for r in rows}):
    sub = [r for r in rows if r["layer"] == layer]
    lines.append(f"| {layer} | " + " | ".join(_fmt(_mean(sub, k, f))
                                              for _, k, f in cols) + " |")
  return "\n".join(lines)


def recorded_calibration(config: ml_collections.ConfigDict,
                         eval_data: str | None, model: str | None,
                         num_calib_windows: int):
  """Step 1 (shared with `research.value_tables_runner`): (the calibration
  inputs, every layer's recorded q / pre-RoPE k / v, the header of the
  output json: machine, model, data and both token ranges)."""
  inputs = calibration_inputs(config, eval_data, model, num_calib_windows,
                              load_key_stats=False)
  split = inputs.split
  records = record_qkv(inputs.model, split.calib_WxT, batch_size=1)
  header = {"machine": machine_description(), "model": inputs.model_name,
            "data": inputs.source,
            "calibration_tokens": list(split.calib_range),
            "evaluation_tokens": list(split.eval_range)}
  return inputs, records, header


def run_dependence(config: ml_collections.ConfigDict, workdir: str,
                   eval_data: str | None = None, model: str | None = None,
                   options: DependenceOptions = DependenceOptions()) -> dict:
  """Steps 1-3 of the module docstring; returns dependence.json's content."""
  started = time.perf_counter()
  inputs, records, header = recorded_calibration(
      config, eval_data, model, options.num_calib_windows)
  lm, split = inputs.model, inputs.split
  rows = measure(lm, records, options)
  chain = measure_chain(lm, records, options)
  out = {**header,
         "tokens_per_head": int(np.prod(records[0].v_BxTxKxH.shape[:2])),
         "options": dataclasses.asdict(options), "rows": rows,
         "chain": chain,
         "seconds": round(time.perf_counter() - started, 1)}
  path = pathlib.Path(workdir)
  path.mkdir(parents=True, exist_ok=True)
  (path / "dependence.json").write_text(json.dumps(out, indent=1),
                                        encoding="utf-8")
  md = (f"# Dependence left by scalar formats: {inputs.model_name}\n\n"
        f"{out['tokens_per_head']} calibration tokens per head "
        f"({inputs.source}, tokens {split.calib_range[0]}..."
        f"{split.calib_range[1]}); gains in equivalent bits per coordinate "
        f"(6.02 dB = 1 bit) at {options.rate} bits: PCA = a static basis "
        "with reverse water-filling vs equal bits per channel; alloc-only = "
        "unequal bits per native channel; ridge = -log4(held-out relative "
        "MSE) of the prediction from the previous layer; VQ dC rR = "
        "k-means on C-channel groups vs per-channel Lloyd-Max at R bits "
        f"(layers 0, {options.vq_layer_stride}, "
        f"{2 * options.vq_layer_stride}, ...). "
        f"{out['seconds']} s on {out['machine']}.\n\n"
        + summary_markdown(rows, options) + "\n\n"
        "## The prediction chain through the quantizer\n\n"
        "Layer l predicted from the chain's reconstruction of layer l-1 "
        "(K from K; V from this layer's K and the previous V), only the "
        "residual coded by the same int-B asymmetric g32 quantizer; gains "
        "= 0.5 log2(held-out MSE direct / predicted), means over layers "
        "1.. (V from own K: over all layers); cost = the predictors' "
        "bfloat16 weights and intercepts per cached element at the "
        "context; net = gain - cost, per element of K and V.\n\n"
        + chain_markdown(chain) + "\n")
  (path / "dependence.md").write_text(md, encoding="utf-8")
  (path / "config.json").write_text(
      config.to_json(indent=1) if hasattr(config, "to_json") else "{}",
      encoding="utf-8")
  return out
