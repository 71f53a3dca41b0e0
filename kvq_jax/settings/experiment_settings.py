"""ConfigDict -> frozen, validated settings: the config/code boundary."""

from __future__ import annotations

import dataclasses

import ml_collections

from kvq_jax.cache.key_affine import STORAGES
from kvq_jax.cache.spec import CacheSpec
from kvq_jax.eval.windows import SCORINGS, check_scoring
from kvq_jax.models.dtypes import parse_dtype
from kvq_jax.persist.key_stats_store import check_model, load_key_stats
from kvq_jax.quant import FORMATS, QuantSpec
from kvq_jax.settings import key_stats_context
from kvq_jax.settings.short_specs import (parse_layer_overrides,
                                          parse_short_spec)

KV_TYPES = ("none", "int", "fp8_e4m3", "fp8_e5m2")
INT_BITS = tuple(int(f.removeprefix("int")) for f in FORMATS
                 if f.startswith("int"))  # 8, 5, 4, 3, 2, 1.
IMPLEMENTATIONS = ("xla", "pallas")


@dataclasses.dataclass(frozen=True)
class EvalSettings:
  num_windows: int
  window_len: int
  scoring: str
  batch_size: int
  # Tokens per prefill call of a chunked evaluation (context_curve).
  prefill_chunk: int


@dataclasses.dataclass(frozen=True)
class MemorySettings:
  budget_gib: float | None  # None: the weights plus 1 GiB (memory_report).
  weight_bytes_per_param: float


@dataclasses.dataclass(frozen=True)
class DecodeBenchSettings:
  batch_size: int
  context: int
  steps: int


@dataclasses.dataclass(frozen=True)
class ExperimentSettings:
  model: str
  dtype: str
  eval: EvalSettings
  quantize: bool
  cache_spec: CacheSpec | None
  cache_dtype: str
  attention_impl: str
  memory: MemorySettings
  decode_bench: DecodeBenchSettings
  # Where cache_spec's key affines came from (None: no key stats): the
  # directory, and for 'auto' recipes the calibration's metadata.
  key_stats_source: dict | None = None
  made_for: str = ""  # The model an allocation preset was made for.


def _positive(value, field: str, minimum: int = 1) -> int:
  if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
    raise ValueError(
        f"config.{field}={value!r}: allowed: an integer >= {minimum}.")
  return value


def quant_spec_from_config(kv: ml_collections.ConfigDict | str,
                           field: str) -> QuantSpec | None:
  """config.cache.k / .v -> QuantSpec (None for type='none' or 'fp'): a
  `base.kv(...)` ConfigDict or a short spec string (`'int4_g32_asym'`:
  `settings.short_specs`)."""
  if isinstance(kv, str):
    try:
      return parse_short_spec(kv)
    except ValueError as e:
      raise ValueError(f"config.{field}: {e}") from e
  if kv.type not in KV_TYPES:
    raise ValueError(
        f"config.{field}.type={kv.type!r}: allowed: {', '.join(KV_TYPES)}.")
  if kv.type == "none":
    return None
  if kv.type == "int":
    if kv.bits not in INT_BITS:
      raise ValueError(
          f"config.{field}.bits={kv.bits!r}: allowed for type='int': "
          f"{', '.join(map(str, INT_BITS))} (1 with scheme='vector' only).")
    fmt = f"int{kv.bits}"
  else:
    fmt = kv.type
  try:
    return QuantSpec(
        format=fmt, scheme=kv.scheme, granularity=kv.granularity,
        group_size=kv.group_size or None, clip_ratio=float(kv.clip_ratio),
        scale_dtype=kv.scale_dtype, rounding=kv.get("rounding", "kvq"),
        outliers=kv.get("outliers", 0))
  except ValueError as e:
    raise ValueError(f"config.{field}: {e}") from e


def _key_affines(value: str, config: ml_collections.ConfigDict,
                 eval_settings: EvalSettings) -> tuple[tuple, dict | None]:
  """config.cache.key_stats -> (per-layer `KeyAffine`s, where they came
  from): '' -> ((), None); a directory -> its affines
  (`kvq_jax.persist.key_stats_store`; refused if made for another model
  than the open run's); a recipe 'auto[:...]' -> built on first use for
  the open run's model and text (`settings.key_stats_context`; refused
  outside a run)."""
  if not value:
    return (), None
  run = key_stats_context.current()
  if not key_stats_context.is_recipe(value):
    if run is not None:
      check_model(value, run.model)
    return load_key_stats(value), {"path": value}
  if run is None:
    raise ValueError(
        f"cache.key_stats={value!r} is a recipe built for the model being "
        "run, and no run names one here; allowed here: a directory written "
        "by `python -m experiments.calibrate_keys` (an experiment's library "
        "call opens the run: calibration.auto_key_stats.run_context).")
  path, source = run.resolve(value, run.model, run.eval_data,
                             eval_settings.window_len,
                             eval_settings.num_windows, config.dtype)
  run.resolved.setdefault(value, source)
  return load_key_stats(path), source


def _stored_affines(affines: tuple, dtype: str) -> tuple:
  """config.cache.key_affine_dtype: the key affines' shift and scale held
  (and charged) in float32 or float16 (`KeyAffine.storage`)."""
  if dtype not in STORAGES:
    raise ValueError(
        f"config.cache.key_affine_dtype={dtype!r}: allowed: "
        f"{', '.join(STORAGES)}.")
  return tuple(dataclasses.replace(a, storage=dtype) for a in affines)


def _rotation_seed(value: int) -> int | None:
  """config.cache.rotation_seed: -1 -> None (plain Hadamard), N >= 0 -> N."""
  if isinstance(value, bool) or not isinstance(value, int) or value < -1:
    raise ValueError(
        f"config.cache.rotation_seed={value!r}: allowed: -1 (plain Hadamard) "
        "or an integer >= 0 (randomised Hadamard seed).")
  return None if value == -1 else value


def check_made_for(made_for: str, model: str) -> None:
  """ValueError when an allocation preset made for one model runs on
  another: its per-layer formats are indexed by that model's layers."""
  if made_for and model != made_for:
    raise ValueError(
        f"this preset was allocated for {made_for} (config.made_for: its "
        f"per-layer formats are that model's), and the run's model is "
        f"{model}; allowed: --model={made_for}, or a preset allocated for "
        f"{model}.")


def settings_from_config(config: ml_collections.ConfigDict
                         ) -> ExperimentSettings:
  """Validated settings of `config`; a key-stats recipe resolves for the
  open run (`_key_affines`), and an allocation preset (`made_for`) is
  refused in a run of another model (`check_made_for`)."""
  made_for = config.get("made_for", "")
  run = key_stats_context.current()
  if run is not None:
    check_made_for(made_for, run.model)
  ev = config.eval
  if ev.num_windows < 0:
    raise ValueError(
        f"config.eval.num_windows={ev.num_windows}: allowed: >= 1, or 0 for "
        "every whole window of the text.")
  try:
    check_scoring(ev.scoring)
  except ValueError:
    raise ValueError(
        f"config.eval.scoring={ev.scoring!r}: allowed: "
        f"{', '.join(SCORINGS)}, last_N (N >= 1, e.g. last_256).") from None
  eval_settings = EvalSettings(
      num_windows=ev.num_windows,
      window_len=_positive(ev.window_len, "eval.window_len", minimum=2),
      scoring=ev.scoring,
      batch_size=_positive(ev.batch_size, "eval.batch_size"),
      prefill_chunk=_positive(ev.prefill_chunk, "eval.prefill_chunk"))
  parse_dtype(config.dtype, "config.dtype")
  cache = config.cache
  cache_dtype = cache.dtype or config.dtype
  parse_dtype(cache_dtype, "config.cache.dtype")
  k = quant_spec_from_config(cache.k, "cache.k")
  v = quant_spec_from_config(cache.v, "cache.v")
  overrides = parse_layer_overrides(cache.layer_overrides)
  spec = None
  key_stats_source = None
  if k is not None or v is not None or overrides:
    try:
      affines, key_stats_source = _key_affines(
          cache.get("key_stats", ""), config, eval_settings)
      affines = _stored_affines(affines,
                                cache.get("key_affine_dtype", "float32"))
      spec = CacheSpec(
          k=k, v=v, layer_overrides=overrides, residual=cache.residual,
          flush_block=cache.flush_block or None, sink=cache.sink,
          key_rope=cache.key_rope, hadamard_k=cache.hadamard_k,
          hadamard_v=cache.hadamard_v,
          rotation_seed=_rotation_seed(cache.get("rotation_seed", -1)),
          key_affines=affines,
          block_size=cache.block_size,
          attention_impl=config.attention.impl,
          code_read=config.attention.get("code_read", "dequantize"),
          window_dtype=cache.window_dtype,
          component_allocation=cache.get("component_allocation", "greedy"))
    except ValueError as e:
      raise ValueError(f"config.cache: {e}") from e
  if config.attention.impl not in IMPLEMENTATIONS:
    raise ValueError(
        f"config.attention.impl={config.attention.impl!r}: allowed: "
        f"{', '.join(IMPLEMENTATIONS)}.")
  if config.memory.budget_gib < 0:
    raise ValueError(
        f"config.memory.budget_gib={config.memory.budget_gib}: allowed: a "
        "number of GiB > 0, or 0 for the weights plus 1 GiB.")
  weight_bytes = {"float32": 4.0, "bfloat16": 2.0, "float16": 2.0,
                  "int8": 1.0, "int4": 0.5}
  if config.memory.weight_dtype not in weight_bytes:
    raise ValueError(
        f"config.memory.weight_dtype={config.memory.weight_dtype!r}: allowed: "
        f"{', '.join(weight_bytes)}.")
  db = config.decode_bench
  return ExperimentSettings(
      model=config.model, dtype=config.dtype, eval=eval_settings,
      quantize=bool(config.quantize), cache_spec=spec, cache_dtype=cache_dtype,
      attention_impl=config.attention.impl,
      memory=MemorySettings(
          budget_gib=float(config.memory.budget_gib) or None,
          weight_bytes_per_param=weight_bytes[config.memory.weight_dtype]),
      decode_bench=DecodeBenchSettings(
          batch_size=_positive(db.batch_size, "decode_bench.batch_size"),
          context=_positive(db.context, "decode_bench.context"),
          steps=_positive(db.steps, "decode_bench.steps")),
      key_stats_source=key_stats_source, made_for=made_for)
