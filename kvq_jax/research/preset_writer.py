"""An `Allocation` as a Python preset that `experiments.run` can verify.

The preset builds on `configs/base.py`: the most common K and V formats
become cache.k / cache.v, every other layer a `cache.layer_overrides` entry
(short names, `settings.short_specs`). Model, dtypes, key_rope, Hadamard,
key statistics (and the dtype of their affines), sinks, residual, flush block and eval settings are copied from the sensitivity run, so `experiments.run`
scores the same windows the prediction came from.
"""

from __future__ import annotations

import collections
import pathlib

from kvq_jax.research.allocator import Allocation
from kvq_jax.settings.short_specs import parse_short_spec

_COPIED = (("model", ("model",)), ("dtype", ("dtype",)),
           ("eval.num_windows", ("eval", "num_windows")),
           ("eval.window_len", ("eval", "window_len")),
           ("eval.scoring", ("eval", "scoring")),
           ("eval.batch_size", ("eval", "batch_size")),
           ("cache.dtype", ("cache", "dtype")),
           ("cache.key_rope", ("cache", "key_rope")),
           ("cache.hadamard_k", ("cache", "hadamard_k")),
           ("cache.hadamard_v", ("cache", "hadamard_v")),
           ("cache.rotation_seed", ("cache", "rotation_seed")),
           ("cache.key_stats", ("cache", "key_stats")),
           ("cache.key_affine_dtype", ("cache", "key_affine_dtype")),
           ("cache.sink", ("cache", "sink")),
           ("cache.residual", ("cache", "residual")),
           ("cache.flush_block", ("cache", "flush_block")),
           ("cache.window_dtype", ("cache", "window_dtype")),
           ("attention.impl", ("attention", "impl")))


def kv_call(name: str) -> str:
  """Short format name -> `base.kv(...)` source for cache.k / cache.v."""
  spec = parse_short_spec(name)
  if spec is None:
    return "base.kv(type='none')"
  kind = "int" if spec.format.startswith("int") else spec.format
  rounding = "" if spec.rounding == "kvq" else f", rounding={spec.rounding!r}"
  if spec.outliers:
    rounding += f", outliers={spec.outliers}"
  return (f"base.kv(type={kind!r}, bits={spec.bits}, scheme={spec.scheme!r}, "
          f"granularity={spec.granularity!r}, "
          f"group_size={spec.group_size or 0}, "
          f"clip_ratio={spec.clip_ratio!r}, scale_dtype={spec.scale_dtype!r}"
          f"{rounding})")


def _most_common(names) -> str:
  return collections.Counter(names).most_common(1)[0][0]


def overrides_text(allocation: Allocation, k_default: str,
                   v_default: str) -> str:
  """'LAYERS:K/V;...' for the layers whose pair differs from the defaults."""
  groups: dict[tuple[str, str], list[int]] = {}
  for layer, pair in enumerate(allocation.layer_pairs()):
    if pair != (k_default, v_default):
      groups.setdefault(pair, []).append(layer)
  return ";".join(f"{','.join(map(str, layers))}:{k}/{v}"
                  for (k, v), layers in groups.items())


_MISSING = object()


def _lookup(config: dict, path: tuple[str, ...]):
  """The value at `path`, or _MISSING (a sensitivity run older than the
  field: the preset keeps base.py's default)."""
  for key in path:
    if not isinstance(config, dict) or key not in config:
      return _MISSING
    config = config[key]
  return config


def preset_source(allocation: Allocation, meta: dict, baseline: dict,
                  sensitivity_path: str, preset_path: str) -> str:
  k_default = _most_common(allocation.k_formats)
  v_default = _most_common(allocation.v_formats)
  overrides = overrides_text(allocation, k_default, v_default)
  per_layer = ", ".join(f"L{i} {k}/{v}"
                        for i, (k, v) in enumerate(allocation.layer_pairs()))
  workdir = preset_path.removesuffix(".py")
  doc = (
      f'"""Mixed-precision KV cache for a {allocation.budget:g} bits/element '
      f"budget ({allocation.mean_bits:.4f} achieved).\n\n"
      f"Predicted damage (additive model over single-tensor probes): "
      f"{allocation.metric} = {allocation.predicted_damage:+.6g}\n"
      f"From {sensitivity_path} ({meta['preset']} on {meta['model']}, "
      f"{baseline['num_windows']} windows x {baseline['window_len']}, "
      f"ppl_baseline {baseline['ppl_baseline']:.6g}).\n"
      f"Per layer (K/V): {per_layer}.\n\n"
      f"Verify: python -m experiments.run --config={preset_path} "
      f"--workdir={workdir}\n"
      '"""\n')
  config = meta["config"]
  lines = [doc, "from __future__ import annotations", "",
           "from configs import base", "", "", "def get_config():",
           "  c = base.get_config()"]
  for field, path in _COPIED:
    value = _lookup(config, path)
    if value is not _MISSING:
      lines.append(f"  c.{field} = {value!r}")
  lines += [f"  c.cache.k = {kv_call(k_default)}",
            f"  c.cache.v = {kv_call(v_default)}",
            f"  c.cache.layer_overrides = {overrides!r}",
            f"  c.made_for = {meta['model']!r}",  # Its layers are this model's.
            "  return c", ""]
  return "\n".join(lines)


def write_preset(path: str | pathlib.Path, allocation: Allocation,
                 table: dict, sensitivity_path: str) -> pathlib.Path:
  path = pathlib.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(preset_source(allocation, table["meta"], table["baseline"],
                                sensitivity_path, str(path)),
                  encoding="utf-8")
  return path
