"""Key statistics a preset needs, built on first use for the model being run.

A preset asks for them with a recipe instead of a directory:

  cache.key_stats = "auto"                                  # std mode
  cache.key_stats = "auto:mode=range,range_quantile=0.99"   # kq presets

The fields after "auto:" are `KeyStatsOptions`' (comma-separated
name=value; codebook_bits as 2|3|4). On first use, `ensure_key_stats` runs
what `python -m experiments.calibrate_keys` runs: the full-precision model's
pre-RoPE keys and queries on the last NUM_CALIB_WINDOWS windows of the
evaluation text (disjoint from the evaluation windows, the first
eval.num_windows: asserted on every use, cached or not), then
`key_stats.key_affines`. It prints one line saying so and caches the result
under `cache_root()/key_stats/<model>-<key>/` with the converted
parameters' locks, atomic rename and checksums (`entry_lock`,
`entry_marker`). The key is a sha256 over the model file's identity
(`param_cache.source_key`), the text's sha256, the window length and the
recipe, so another model, text or recipe gets its own entry.

An explicit directory (`--config.cache.key_stats=DIR`) still wins; one made
for another model is refused (`key_stats_store.check_model`).

Which model and text: the `run_context(model, eval_data)` an experiment
opens around its work (`resolves_for_run` on its library call, or the
script itself where the library call sits in a lower layer: sweep,
generate, serve_bench), read by `settings_from_config` through
`settings.key_stats_context`. Outside one a recipe is refused (capacity
arithmetic, which loads no weights, then uses stand-ins).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import inspect
import json
import pathlib
import sys
import time

from typing import Callable, Iterator

from absl import logging

from kvq_jax.assets import cache_dir
from kvq_jax.assets import cache_errors
from kvq_jax.assets import entry_lock
from kvq_jax.assets import entry_marker
from kvq_jax.assets import param_cache
from kvq_jax.assets import registry
from kvq_jax.cache.key_stats_recipe import recipe_items
from kvq_jax.calibration.key_stats import KeyStatsOptions, key_affines
from kvq_jax.calibration.recording import record_qkv
from kvq_jax.calibration.windows import assert_disjoint, split_windows
from kvq_jax.eval.corpus import load_eval_text
from kvq_jax.eval.windows import text_ids, text_per_window
from kvq_jax.persist import key_stats_store
from kvq_jax.settings import key_stats_context

NUM_CALIB_WINDOWS = 4  # What the presets' calibrate_keys commands used.
FORMAT_VERSION = 1
_FIELDS = {f.name: f.type for f in dataclasses.fields(KeyStatsOptions)}


@contextlib.contextmanager
def run_context(model: str, eval_data: str | None) -> Iterator[None]:
  """Within the block, recipes resolve for `model` on `eval_data`'s
  calibration windows, built by `ensure_key_stats` (module docstring)."""
  with key_stats_context.use(key_stats_context.KeyStatsRun(
      model, eval_data, ensure_key_stats)):
    yield


def resolves_for_run(fn: Callable) -> Callable:
  """Decorates an experiment's library call: its body runs in the
  `run_context` of its `model` argument (else its `config` argument's
  .model, else the default model) and its `eval_data` argument (None if it
  has none)."""
  signature = inspect.signature(fn)

  @functools.wraps(fn)
  def wrapper(*args, **kwargs):
    bound = signature.bind(*args, **kwargs)
    bound.apply_defaults()
    arguments = bound.arguments
    model = arguments.get("model")
    if not model and not isinstance(arguments.get("config"), str):
      model = getattr(arguments.get("config"), "model", None)
    with run_context(model or registry.DEFAULT_MODEL,
                     arguments.get("eval_data")):
      return fn(*args, **kwargs)
  return wrapper


def parse_recipe(value: str) -> KeyStatsOptions:
  """'auto[:name=value,...]' -> KeyStatsOptions; ValueError naming what is
  allowed."""
  if not key_stats_context.is_recipe(value):
    raise ValueError(f"cache.key_stats={value!r} is not a recipe; allowed: "
                     "'auto' or 'auto:name=value,...'.")
  fields = {}
  for item in recipe_items(value):
    name, sep, text = item.partition("=")
    name = name.strip()
    if not sep or name not in _FIELDS:
      raise ValueError(
          f"cache.key_stats={value!r}: item {item!r}; allowed: name=value "
          f"with name among {', '.join(_FIELDS)}.")
    kind = _FIELDS[name]
    try:
      if name == "codebook_bits":
        fields[name] = tuple(int(b) for b in text.split("|") if b)
      elif kind == "bool":
        if text not in ("true", "false"):
          raise ValueError(text)
        fields[name] = text == "true"
      elif kind == "float":
        fields[name] = float(text)
      elif kind == "int":
        fields[name] = int(text)
      else:
        fields[name] = text
    except ValueError:
      raise ValueError(f"cache.key_stats={value!r}: {name}={text!r} is not "
                       f"a {kind}.") from None
  try:
    return KeyStatsOptions(**fields)
  except ValueError as e:
    raise ValueError(f"cache.key_stats={value!r}: {e}") from e


def entry_dir(model: str, text: str, window_len: int,
              options: KeyStatsOptions) -> pathlib.Path:
  source = registry.resolve_model(model)
  blob = json.dumps([FORMAT_VERSION, param_cache.source_key(source),
                     hashlib.sha256(text.encode()).hexdigest(), window_len,
                     NUM_CALIB_WINDOWS, dataclasses.asdict(options)])
  key = hashlib.sha256(blob.encode()).hexdigest()[:20]
  return cache_dir.cache_root() / "key_stats" / f"{source.stem}-{key}"


def _usable(entry: pathlib.Path) -> bool:
  if not entry.is_dir():
    return False
  try:
    entry_marker.check_marker(entry)
    return True
  except entry_marker.Unusable:
    return False


def _eval_range(window_len: int, num_windows: int, bos_id: int | None,
                calib_start: int) -> tuple[int, int]:
  """The evaluation windows' text tokens (0 windows: every whole one, which
  reaches into the calibration tokens)."""
  per = text_per_window(window_len, bos_id)
  if num_windows == 0:
    raise ValueError(
        "cache.key_stats='auto...' calibrates on the text's last "
        f"{NUM_CALIB_WINDOWS} windows, and eval.num_windows=0 (every window) "
        f"would evaluate on them; allowed: eval.num_windows <= "
        f"{calib_start // per}, or an explicit cache.key_stats directory.")
  return (0, num_windows * per)


def ensure_key_stats(value: str, model: str, eval_data: str | None,
                     window_len: int, num_eval_windows: int,
                     dtype: str = "float32") -> tuple[pathlib.Path, dict]:
  """The cached key-stats directory of recipe `value` for `model` on the
  text `eval_data` (None: the default text), built if missing; and the
  sidecar metadata (calibration tokens, data, recipe, whether it was built
  now). Raises ValueError if the evaluation would overlap the calibration
  tokens."""
  options = parse_recipe(value)
  text, source = load_eval_text(eval_data)
  entry = entry_dir(model, text, window_len, options)
  built = False
  if not _usable(entry):
    with entry_lock.hold(entry, f"calibrating key stats for {model}"):
      entry_marker.sweep_leftovers(entry)
      if not _usable(entry):
        entry_marker.discard(entry)
        _build(entry, value, options, model, text, source, window_len,
               num_eval_windows, dtype)
        built = True
  metadata = json.loads(
      (entry / key_stats_store.SIDECAR).read_text())["metadata"]
  calib = tuple(metadata["calibration_tokens"])
  assert_disjoint(_eval_range(window_len, num_eval_windows,
                              metadata["bos_id"], calib[0]), calib)
  if not built:
    logging.info("key stats %r for %s: cached at %s", value, model, entry)
  return entry, {**metadata, "path": str(entry), "built_now": built}


def _build(entry: pathlib.Path, value: str, options: KeyStatsOptions,
           model: str, text: str, source: str, window_len: int,
           num_eval_windows: int, dtype: str) -> None:
  from kvq_jax.facade import load_model  # pylint: disable=g-import-not-at-top
  started = time.perf_counter()
  lm = load_model(model, dtype)
  if lm.tokenizer is None:
    raise ValueError(f"cache.key_stats={value!r}: model {model!r} has no "
                     "tokenizer to read the calibration text with.")
  lm.config.check_context(window_len, f"eval.window_len={window_len}")
  ids, bos_id = text_ids(lm.tokenizer, text)
  split = split_windows(ids, window_len, num_eval_windows, NUM_CALIB_WINDOWS,
                        bos_id)
  print(f"kvq_jax: key stats {value!r} for {model}: none cached; "
        f"calibrating on tokens {list(split.calib_range)} of {source} "
        f"(the last {NUM_CALIB_WINDOWS} windows of {window_len}) into "
        f"{entry}", file=sys.stderr, flush=True)
  records = record_qkv(lm, split.calib_WxT, batch_size=1)
  affines = key_affines(records, lm.config.rotary_dim, options)
  metadata = {
      "model": model, "data": source, "recipe": value,
      "calibration_tokens": list(split.calib_range),
      "num_calib_windows": NUM_CALIB_WINDOWS, "window_len": window_len,
      "bos_id": bos_id, **dataclasses.asdict(options),
      "seconds": round(time.perf_counter() - started, 2)}
  metadata["codebook_bits"] = list(options.codebook_bits)
  # Written aside, checksummed and renamed into place by the store itself
  # (the caller holds the entry's lock).
  with cache_errors.explained(entry.parent, f"key stats for {model}"):
    key_stats_store.save_key_stats(entry, affines, metadata)
