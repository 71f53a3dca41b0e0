"""`experiments.value_tables`' library call: would tables fitted per layer
(or per layer and kv head), weighted by the output projection, or without
a per-vector scale, code the values better than the shipped Gaussian table
(`research.value_tables`), and by more than they cost to hold?

1. Calibration windows: the last `num_calib_windows` windows of the text,
   disjoint from the evaluation windows (`calibration.key_runner`'s split);
   every layer's values recorded from the full-precision model, turned by
   the layer's randomised Hadamard (`rotation_seed`, the cache's signs).
2. Per layer (every `layer_stride`-th) and kv head; tables fitted on the
   first `train_frac` of the tokens, costs on the rest, plain MSE and in
   the metric sum_n W_o[n] W_o[n]^T of the head's query heads (the error
   after the output projection; `dependence_runner.value_metric`):
   - `shared`: the shipped table with a scale per vector (the cache today);
   - `head_plain`: k-means of this head's normalised groups from the
     shipped table, unweighted (the shipped table's own objective);
   - `head_weighted`: the same weighted by rho^2 and the metric's group
     weights (`value_tables.metric_group_weights`);
   - `layer_weighted`: one table for all kv heads of the layer, weighted;
   - `head_unscaled`: a table of the raw rotated groups, no scale stored,
     weighted by the metric's group weights.
3. The model means; each fitted variant's tables charged per cached value
   element at every context in `contexts` (bfloat16 entries, one table per
   layer and head, or per layer), and its net = weighted gain + the scale
   bits it no longer stores - that charge. value_tables.json,
   value_tables.md and config.json in `workdir`.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import time

import ml_collections
import numpy as np
from absl import logging

from kvq_jax.cache import hadamard
from kvq_jax.quant import vector_codebook
from kvq_jax.research import value_tables as vt
from kvq_jax.research.dependence_runner import (o_kernels,
                                                recorded_calibration,
                                                value_metric)

VARIANTS = ("head_plain", "head_weighted", "layer_weighted", "head_unscaled")


@dataclasses.dataclass(frozen=True)
class ValueTableOptions:
  """What to measure; see the module docstring."""

  bits: int = 2
  num_calib_windows: int = 8
  rotation_seed: int = 0
  layer_stride: int = 1
  train_frac: float = 0.75
  iters: int = 20
  scale_bits: int = 8  # The scale per vector the cache stores (_se5m2).
  contexts: tuple[int, ...] = (512, 4096)

  def __post_init__(self):
    vector_codebook.group_dim(self.bits)  # ValueError for unsupported bits.
    if not 0 < self.train_frac < 1:
      raise ValueError(f"value tables: train_frac {self.train_frac}; "
                       "allowed: strictly between 0 and 1.")
    if min(self.num_calib_windows, self.layer_stride, self.iters) < 1:
      raise ValueError("value tables: num_calib_windows, layer_stride and "
                       "iters must be >= 1.")
    if any(c < 1 for c in self.contexts):
      raise ValueError(f"value tables: contexts {self.contexts}; allowed: "
                       "positive token counts.")


def _scaled_points(x_NxD, c, group_w_J):
  """(normalised c-groups, their weights rho^2 x group weight)."""
  y, rho2 = vt.normalised(x_NxD)
  n, d = y.shape
  return (y.reshape(n * d // c, c),
          vt.group_weights(n, d, c, rho2, group_w_J))


def layer_rows(v_NxKxD: np.ndarray, metrics_KxDxD: np.ndarray, layer: int,
               options: ValueTableOptions) -> list[dict]:
  """Step 2 for one layer: `v_NxKxD` its values (tokens in order),
  `metrics_KxDxD` each kv head's native metric. One row per kv head."""
  n, kh, d = v_NxKxD.shape
  c = vector_codebook.group_dim(options.bits)
  signs = hadamard.sign_vector(d, (options.rotation_seed, layer))
  h = hadamard.hadamard_matrix_np(d)
  x = (np.asarray(v_NxKxD, np.float64) * signs) @ h.astype(np.float64)
  ntrain = int(n * options.train_frac)
  if not 0 < ntrain < n:
    raise ValueError(f"value tables: {n} tokens, train_frac "
                     f"{options.train_frac}: need tokens on both sides.")
  shared = vector_codebook.centroids(options.bits).astype(np.float64)
  m_rot = [vt.rotated_metric(metrics_KxDxD[k], signs, h) for k in range(kh)]
  gw = [vt.metric_group_weights(m, c) for m in m_rot]
  pooled = [_scaled_points(x[:ntrain, k], c, gw[k]) for k in range(kh)]
  layer_table = vt.fit_table(np.concatenate([p for p, _ in pooled]), shared,
                             np.concatenate([w for _, w in pooled]),
                             options.iters)
  rows = []
  for k in range(kh):
    train, test = x[:ntrain, k], x[ntrain:, k]
    points, weights = pooled[k]
    raw = train.reshape(-1, c)
    rms = float(np.sqrt(np.mean(raw * raw)))
    tables = {
        "head_plain": vt.fit_table(points, shared, None, options.iters),
        "head_weighted": vt.fit_table(points, shared, weights, options.iters),
        "layer_weighted": layer_table,
        "head_unscaled": vt.fit_table(
            raw, shared * rms, vt.group_weights(ntrain, d, c, None, gw[k]),
            options.iters)}
    base = vt.distortion(test, vt.encode_scaled(test, shared), m_rot[k])
    row = {"layer": layer, "kv_head": k, "shared": base}
    for name, table in tables.items():
      enc = vt.encode_unscaled if name == "head_unscaled" else vt.encode_scaled
      cost = vt.distortion(test, enc(test, table), m_rot[k])
      row[name] = dict(cost, **{
          f"gain_bits_{m}": vt.gain_bits(base[m], cost[m])
          for m in ("plain", "weighted")})
    rows.append(row)
  return rows


def measure(lm, records, options: ValueTableOptions) -> list[dict]:
  """Step 2 over the model's layers."""
  cfg = lm.config
  group = cfg.num_heads // cfg.num_kv_heads
  kernels = o_kernels(lm)
  rows = []
  for layer in range(0, len(records), options.layer_stride):
    v = np.asarray(records[layer].v_BxTxKxH, np.float64)
    v_NxKxD = v.reshape(-1, cfg.num_kv_heads, cfg.head_dim)
    metrics = np.stack([
        value_metric(kernels[layer], range(k * group, (k + 1) * group),
                     cfg.head_dim) for k in range(cfg.num_kv_heads)])
    rows += layer_rows(v_NxKxD, metrics, layer, options)
    logging.info("value tables: layer %d done", layer)
  return rows


def summary(rows: list[dict], cfg, options: ValueTableOptions) -> list[dict]:
  """Step 3: per variant the mean gains and, per context, the charge and
  the net."""
  c = vector_codebook.group_dim(options.bits)
  layers = cfg.num_layers
  out = []
  for name in VARIANTS:
    tables = layers if name == "layer_weighted" else layers * cfg.num_kv_heads
    saved = options.scale_bits / cfg.head_dim if name == "head_unscaled" else 0
    g_plain = float(np.mean([r[name]["gain_bits_plain"] for r in rows]))
    g_w = float(np.mean([r[name]["gain_bits_weighted"] for r in rows]))
    per_ctx = []
    for ctx in options.contexts:
      charge = vt.table_bits(tables, 256, c, ctx, layers, cfg.num_kv_heads,
                             cfg.head_dim)
      per_ctx.append({"context": ctx, "charge": charge,
                      "net": g_w + saved - charge})
    out.append({"variant": name, "tables": tables, "gain_bits_plain": g_plain,
                "gain_bits_weighted": g_w, "scale_bits_saved": saved,
                "contexts": per_ctx})
  return out


def summary_markdown(summ: list[dict]) -> str:
  ctxs = [p["context"] for p in summ[0]["contexts"]]
  head = ("| table | tables per model | gain (plain MSE) | gain (W_o metric) "
          "| scale bits saved | "
          + " | ".join(f"charge / net @{c}" for c in ctxs) + " |")
  lines = [head, "|---" * (5 + len(ctxs)) + "|"]
  for s in summ:
    cells = [s["variant"], str(s["tables"]), f"{s['gain_bits_plain']:+.3f}",
             f"{s['gain_bits_weighted']:+.3f}", f"{s['scale_bits_saved']:.3f}"]
    cells += [f"{p['charge']:.3f} / {p['net']:+.3f}" for p in s["contexts"]]
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines)


def run_value_tables(config: ml_collections.ConfigDict, workdir: str,
                     eval_data: str | None = None, model: str | None = None,
                     options: ValueTableOptions = ValueTableOptions()) -> dict:
  """Steps 1-3 of the module docstring; returns value_tables.json's content."""
  started = time.perf_counter()
  inputs, records, header = recorded_calibration(
      config, eval_data, model, options.num_calib_windows)
  lm, split = inputs.model, inputs.split
  rows = measure(lm, records, options)
  summ = summary(rows, lm.config, options)
  out = {**header,
         "options": dataclasses.asdict(options), "summary": summ,
         "rows": rows, "seconds": round(time.perf_counter() - started, 1)}
  path = pathlib.Path(workdir)
  path.mkdir(parents=True, exist_ok=True)
  (path / "value_tables.json").write_text(json.dumps(out, indent=1),
                                          encoding="utf-8")
  (path / "config.json").write_text(config.to_json(indent=1),
                                    encoding="utf-8")
  md = (f"# Fitted value tables: {inputs.model_name}\n\n"
        f"int{options.bits}_vq codes, calibration tokens "
        f"{split.calib_range[0]}...{split.calib_range[1]} of {inputs.source} "
        f"(fit on the first {options.train_frac:g}, costs on the rest), "
        f"layers 0, {options.layer_stride}, ...; gains in equivalent bits "
        "(0.5 log2 of the shared table's cost over the fitted one's), "
        "means over layers and kv heads; charge = the fitted tables' "
        "bfloat16 entries per cached value element at the context; net = "
        "W_o-metric gain + scale bits saved - charge. "
        f"{out['seconds']} s on {out['machine']}.\n\n"
        + summary_markdown(summ) + "\n")
  (path / "value_tables.md").write_text(md, encoding="utf-8")
  return out
