"""Throughput of jitted quantize+dequantize on a [1, T, 3, 64] bf16 KV tensor.

  python -m experiments.bench_quant --tokens=32768 --repeats=10

GB/s counts the bytes of the bfloat16 input only; the ceiling is a jitted
bfloat16 copy (x + 0) of the same tensor.
"""

from __future__ import annotations

from absl import flags
import jax
import jax.numpy as jnp

from kvq_jax.bench.timing import machine_description, time_fn
from kvq_jax.cli import log_setup
from kvq_jax.cli.entry import run_main
from kvq_jax.quant import QuantSpec, dequantize, quantize

_TOKENS = flags.DEFINE_integer(
    "tokens", 32768, "Tokens T of the [1, T, 3, 64] tensor.")
_REPEATS = flags.DEFINE_integer(
    "repeats", 10, "Timed calls per row (median).")

FORMATS = {
    "int8 per_token sym": QuantSpec("int8", "symmetric", "per_token"),
    "int4 g32 sym": QuantSpec("int4", "symmetric", "per_group", 32),
    "int4 g32 asym": QuantSpec("int4", "asymmetric", "per_group", 32),
    "int3 g32 asym": QuantSpec("int3", "asymmetric", "per_group", 32),
    "int2 g32 asym": QuantSpec("int2", "asymmetric", "per_group", 32),
    "fp8_e4m3 g32": QuantSpec("fp8_e4m3", "symmetric", "per_group", 32),
    "fp8_e5m2 g32": QuantSpec("fp8_e5m2", "symmetric", "per_group", 32),
}


def main(argv):
  log_setup.configure_from_flags()
  del argv
  print(machine_description())
  x = jax.random.normal(jax.random.key(0), (1, _TOKENS.value, 3, 64),
                        jnp.bfloat16)
  gb = x.nbytes / 1e9
  copy = jax.jit(lambda a: a + jnp.zeros((), a.dtype))
  ceiling = gb / time_fn(copy, x, repeats=_REPEATS.value)
  print(f"input {tuple(x.shape)} bf16, {x.nbytes / 2**20:.1f} MiB, "
        f"median of {_REPEATS.value}")
  print(f"{'format':<20} {'GB/s':>8} {'vs copy':>8}")
  print(f"{'bf16 copy (ceiling)':<20} {ceiling:8.2f} {1.0:8.3f}")
  for name, spec in FORMATS.items():
    fn = jax.jit(lambda a, spec=spec: dequantize(quantize(a, spec)))
    rate = gb / time_fn(fn, x, repeats=_REPEATS.value)
    print(f"{name:<20} {rate:8.2f} {rate / ceiling:8.3f}")


if __name__ == "__main__":
  run_main(main)
