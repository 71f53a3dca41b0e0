"""Benchmarks decode attention (dense bf16, XLA quantized, Pallas) vs context.

  python experiments/bench_attention.py --max_context=16384
  python experiments/bench_attention.py --shape=8b --formats=int8,int4_g32

Pallas runs compiled on GPU/TPU; on CPU only with --pallas_interpret (which
checks it runs; interpreter times are not kernel timings).
"""

from __future__ import annotations

from absl import app
from absl import flags
import jax

from kvq_jax.kernels import benchmark

SHAPES = {"smollm2": (3, 3, 64), "8b": (8, 4, 128)}  # (K, G, H)

_MAX_CONTEXT = flags.DEFINE_integer(
    "max_context", None, "Largest context; default 131072 on GPU/TPU, 16384 "
    "on CPU. Contexts are 1024, 2048, ... doubling up to it.")
_SHAPE = flags.DEFINE_enum("shape", "smollm2", list(SHAPES),
                           "smollm2: K=3, G=3, H=64; 8b: K=8, G=4, H=128.")
_BATCH = flags.DEFINE_integer("batch", 1, "Sequences.")
_FORMATS = flags.DEFINE_list("formats", ["int8", "int4_g32", "int2_g32"],
                             f"Quantized formats: {list(benchmark.SPECS)}.")
_PALLAS_INTERPRET = flags.DEFINE_bool(
    "pallas_interpret", False, "On CPU, also run the Pallas kernel in "
    "interpret mode (slow; not a timing).")
_REPEATS = flags.DEFINE_integer("repeats", 10, "Timed repeats (median).")
_BLOCK_K = flags.DEFINE_integer("block_k", 128, "Pallas block_k.")


def main(argv):
  del argv
  on_cpu = jax.default_backend() == "cpu"
  max_context = _MAX_CONTEXT.value or (16384 if on_cpu else 131072)
  contexts = []
  c = 1024
  while c <= max_context:
    contexts.append(c)
    c *= 2
  kv_heads, g, head_dim = SHAPES[_SHAPE.value]
  print(benchmark.machine_description())
  print(f"B={_BATCH.value} K={kv_heads} G={g} H={head_dim}, contexts "
        f"{contexts}")
  rows = benchmark.run(
      contexts, batch=_BATCH.value, kv_heads=kv_heads, g=g, head_dim=head_dim,
      formats=_FORMATS.value, pallas=(not on_cpu) or _PALLAS_INTERPRET.value,
      interpret=on_cpu, repeats=_REPEATS.value, block_k=_BLOCK_K.value)
  print(benchmark.format_table(rows))


if __name__ == "__main__":
  app.run(main)
