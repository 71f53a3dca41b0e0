"""Benchmarks decode attention (dense bf16, XLA quantized, Pallas) vs context.

  python -m experiments.bench_attention --max_context=16384
  python -m experiments.bench_attention --model=qwen2.5-coder-1.5b
  python -m experiments.bench_attention --shape=8b --formats=int8,int4_g32

One layer's attention at the (K, G, H) of `--model` (a registered name or a
checkpoint path, read for its metadata only) or of a synthetic `--shape`.

Pallas runs compiled on GPU/TPU; on CPU only with --pallas_interpret (which
checks it runs; interpreter times are not kernel timings).
"""

from __future__ import annotations

from absl import app
from absl import flags
import jax

from kvq_jax import assets
from kvq_jax.facade import model_config
from kvq_jax.kernels import benchmark

SHAPES = {"8b": (8, 4, 128)}  # Synthetic (K, G, H) without a checkpoint.

_MAX_CONTEXT = flags.DEFINE_integer(
    "max_context", None, "Largest context; default 131072 on GPU/TPU, 16384 "
    "on CPU. Contexts are 1024, 2048, ... doubling up to it.")
_MODEL = flags.DEFINE_string("model", assets.DEFAULT_MODEL,
                             "registered name or checkpoint path (shapes)")
_SHAPE = flags.DEFINE_enum("shape", None, list(SHAPES),
                           "instead of --model: 8b = K=8, G=4, H=128.")
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
  if _SHAPE.value:
    source = f"--shape={_SHAPE.value}"
    kv_heads, g, head_dim = SHAPES[_SHAPE.value]
  else:
    config = model_config(_MODEL.value)
    source = f"{_MODEL.value} ({config.name})"
    kv_heads, g, head_dim = (config.num_kv_heads, config.group_size,
                             config.head_dim)
  print(benchmark.machine_description())
  print(f"{source}: B={_BATCH.value} K={kv_heads} G={g} H={head_dim}, "
        f"contexts {contexts}")
  rows = benchmark.run(
      contexts, batch=_BATCH.value, kv_heads=kv_heads, g=g, head_dim=head_dim,
      formats=_FORMATS.value, pallas=(not on_cpu) or _PALLAS_INTERPRET.value,
      interpret=on_cpu, repeats=_REPEATS.value, block_k=_BLOCK_K.value)
  print(benchmark.format_table(rows))


if __name__ == "__main__":
  app.run(main)
