"""entry.run_main: a script's bad input in one line, before any model loads."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[2]


def _script(module: str, *args: str, cache: pathlib.Path
            ) -> tuple[subprocess.CompletedProcess, float]:
  """Runs `python -m module args` with every cache under `cache`."""
  env = dict(os.environ, JAX_PLATFORMS="cpu", XDG_CACHE_HOME=str(cache),
             KVQ_JAX_CACHE=str(cache / "kvq_jax"))
  started = time.perf_counter()
  result = subprocess.run([sys.executable, "-m", module, *args], cwd=REPO,
                          env=env, capture_output=True, text=True,
                          timeout=120, check=False)
  return result, time.perf_counter() - started


def test_a_value_error_prints_one_line_and_debug_the_traceback(tmp_path):
  args = ("--model=llama-3.1-8b", "--device_memory_gib=-5",
          "--weight_bytes_per_param=1")
  result, _ = _script("experiments.capacity", *args, cache=tmp_path)
  assert result.returncode == 1
  assert result.stderr == ("error: device_memory_gib=-5.0: allowed: a finite "
                           "number > 0.\n")
  assert result.stdout == ""
  result, _ = _script("experiments.capacity", *args, "--log_level=debug",
                      cache=tmp_path)
  assert result.returncode == 1
  assert "Traceback (most recent call last)" in result.stderr
  assert result.stderr.rstrip().endswith(
      "ValueError: device_memory_gib=-5.0: allowed: a finite number > 0.")


def test_missing_eval_data_fails_before_any_model_is_fetched(tmp_path):
  cache = tmp_path / "cache"
  cache.mkdir()
  result, seconds = _script("experiments.run", "--eval_data=/nonexistent.txt",
                            f"--workdir={tmp_path / 'out'}", cache=cache)
  assert result.returncode == 1
  assert result.stderr == ("error: flag --eval_data=/nonexistent.txt: "
                           "eval_data='/nonexistent.txt': no such file.\n")
  # The default model (smollm2-135m) was neither fetched nor converted.
  assert not any(cache.iterdir()) and not (tmp_path / "out").exists()
  assert seconds < 60  # Python and the imports; no model, no compilation.
