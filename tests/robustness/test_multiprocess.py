"""`experiments.run` as one run over 2 processes (JAX's distributed runtime).

Two subprocesses `python -m experiments.run --mesh=2x2
--coordinator=localhost:PORT --num_processes=2 --process_id=I` (2 simulated
CPU devices each, gloo collectives) evaluate the tiny HF model: 'data' spans
the processes, 'model' the 2 devices of each. 2 windows in one batch: one
window per process. Process 0's metrics must equal a single-process,
no-mesh run of the same config (run in this pytest process meanwhile) to
float noise, rtol 1e-5 (they agree to the last bit); process 1 writes
nothing and prints no table. Both start on a cold param cache, so its lock
and process-0-only writing run too. (A third window -- a batch that 'data'
does not divide, so it runs replicated -- passes as well but costs another
compile per program: ~8 s more of CI's budget.)
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from kvq_jax.run import runner
from kvq_jax.sharding import distributed
from tests.fixtures import tiny_hf_model

REPO = pathlib.Path(__file__).resolve().parents[2]
TIMEOUT_S = 150  # Both processes; a hang (e.g. a missed collective) fails.
EVAL_KEYS = ("ppl_baseline", "ppl_baseline_stderr", "ppl_quant",
             "ppl_quant_stderr", "delta_ppl", "kl_mean", "top1_agreement",
             "delta_nll_mean", "num_scored_tokens")


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def _start_both(root: pathlib.Path, model: str, text: str) -> list[dict]:
  """Starts processes 0 and 1; returns their records (see `_wait`)."""
  # The suite's own XLA flags (tests/conftest.py: faster compiles) too.
  flags = os.environ.get("XLA_FLAGS", "")
  env = dict(os.environ, JAX_PLATFORMS="cpu", KVQ_JAX_CACHE=str(root / "cache"),
             XLA_FLAGS=f"{flags} --xla_force_host_platform_device_count=2")
  for key in [k for k in env if "_proxy" in k.lower()
              or k == "JAX_COORDINATOR_ADDRESS"]:
    env.pop(key)  # A proxy can hang the localhost coordinator (JAX warns).
  common = [sys.executable, "-m", "experiments.run", "--config=int4_g32",
            f"--model={model}", f"--eval_data={text}",
            "--config.eval.window_len=32", "--config.eval.num_windows=2",
            "--config.eval.batch_size=2", "--mesh=2x2",
            f"--coordinator=localhost:{_free_port()}", "--num_processes=2"]
  procs = []
  for i in range(2):
    out, err = root / f"p{i}.out", root / f"p{i}.err"
    with open(out, "w") as out_f, open(err, "w") as err_f:
      procs.append({"proc": subprocess.Popen(
          [*common, f"--process_id={i}", f"--workdir={root / f'p{i}'}"],
          env=env, cwd=REPO, stdout=out_f, stderr=err_f),
          "out": out, "err": err, "workdir": root / f"p{i}"})
  return procs


def _wait(procs: list[dict], deadline: float) -> None:
  """Adds each process's rc, stdout and stderr; kills both at `deadline`."""
  try:
    for p in procs:
      p["rc"] = p["proc"].wait(timeout=max(1.0, deadline - time.monotonic()))
  except subprocess.TimeoutExpired:
    for p in procs:
      p["proc"].kill()
      p["proc"].wait()
    tails = "\n".join(f"--- process {i} stderr:\n"
                      + p["err"].read_text()[-2000:]
                      for i, p in enumerate(procs))
    pytest.fail(f"2-process run did not finish in {TIMEOUT_S}s:\n{tails}")
  for p in procs:
    p["stdout"], p["stderr"] = p["out"].read_text(), p["err"].read_text()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  root = tmp_path_factory.mktemp("multiprocess")
  config, text = tiny_hf_model.calibration_preset(root, "int4_g32")
  config.eval.num_windows, config.eval.batch_size = 2, 2
  config.decode_bench.context = 16
  config.decode_bench.batch_size = config.decode_bench.steps = 1
  deadline = time.monotonic() + TIMEOUT_S
  procs = _start_both(root, config.model, text)
  try:  # The reference runs here while the two processes start up.
    with pytest.MonkeyPatch.context() as mp:
      mp.setenv("KVQ_JAX_CACHE", str(root / "cache_single"))
      single = runner.run(config, str(root / "single"), eval_data=text,
                          model=config.model, name="int4_g32")
  finally:
    _wait(procs, deadline)
  return procs, single


def test_both_processes_exit_zero(runs):
  procs, _ = runs
  for i, p in enumerate(procs):
    assert p["rc"] == 0, f"process {i}:\n{p['stderr'][-4000:]}"


def test_process_0_metrics_equal_single_process(runs):
  procs, single = runs
  metrics = json.loads((procs[0]["workdir"] / "metrics.json").read_text())
  assert metrics["mesh"] == "2x2" and metrics["processes"] == 2
  assert metrics["num_windows"] == 2
  for key in EVAL_KEYS:  # Measured: bit-identical here (WORKSPACE.md).
    np.testing.assert_allclose(metrics[key], single[key], rtol=1e-5,
                               err_msg=key)


def test_only_process_0_writes_and_prints(runs):
  procs, _ = runs
  assert sorted(p.name for p in procs[0]["workdir"].iterdir()) == [
      "config.json", "metrics.json", "summary.md"]
  assert not procs[1]["workdir"].exists()
  assert "| PPL |" in procs[0]["stdout"]
  assert "decode benchmark not run" in procs[0]["stdout"]
  assert "| PPL |" not in procs[1]["stdout"]
  assert "eval [" not in procs[1]["stderr"]  # No progress bar either.


@pytest.mark.parametrize("args, env, want", [
    ((None, None, None), {}, None),
    (("", None, None), {}, None),
    (("host:1234", 2, 1), {}, ("host:1234", 2, 1)),
    (("[::1]:1234", 2, 0), {}, ("[::1]:1234", 2, 0)),
    (("auto", None, None), {}, (None, None, None)),
    ((None, 4, 3), {distributed.ENV_COORDINATOR: "h:1"}, (None, 4, 3)),
])
def test_distributed_settings(args, env, want):
  got = distributed.distributed_settings(*args, environ=env)
  assert got == (None if want is None else
                 distributed.DistributedSettings(*want))


@pytest.mark.parametrize("args, message", [
    (("host", 2, 0), "allowed: HOST:PORT"),
    (("host:0", 2, 0), "PORT 1..65535"),
    (("host:1234", None, 0), "needs num_processes and process_id"),
    (("host:1234", 2, 2), "0 <= process_id < num_processes"),
    (("host:1234", 0, 0), "num_processes=0: allowed: an integer >= 1"),
    ((None, 2, 0), "without a coordinator"),
])
def test_distributed_settings_rejects(args, message):
  with pytest.raises(ValueError, match=re.escape(message)):
    distributed.distributed_settings(*args, environ={})
