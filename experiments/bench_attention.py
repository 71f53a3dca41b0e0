"""Benchmarks one layer's decode attention vs context, as the cache runs it.

  python -m experiments.bench_attention --contexts=1024,4096,16384
  python -m experiments.bench_attention --kinds=bf16,float32,int8,q4_0 \
      --batch=1,8 --json=runs/bench/attention.json
  python -m experiments.bench_attention --implementations=xla,pallas  # GPU/TPU
  python -m experiments.bench_attention --mode=kernel --shape=8b      # kernel only

--mode=cache (default): `cache.attend` of one token for layer 0 of
`--model`'s shapes (`kvq_jax/bench/attention_bench.py`): kinds bf16 /
float32 (dense), preset names or short specs (`kvq_jax/settings/kinds.py`),
all in caches of the same slots; ratios are to the fastest full-precision
cache. --mode=kernel: the Pallas kernel and the jnp reference on synthetic
packed caches, with effective bandwidth (`kvq_jax/bench/kernel_bench.py`).
Pallas runs compiled on GPU/TPU; on CPU only interpreted
(--pallas_interpret), which checks it runs and is not a timing.
"""

from __future__ import annotations

from absl import flags
import jax

from kvq_jax import assets
from kvq_jax.bench import attention_bench
from kvq_jax.bench import decode_bench
from kvq_jax.bench import kernel_bench
from kvq_jax.bench.kinds import DEFAULT_KINDS
from kvq_jax.cli import log_setup
from kvq_jax.cli.data_flags import int_list
from kvq_jax.cli.entry import run_main
from kvq_jax.facade import model_config

SHAPES = {"8b": (8, 4, 128)}  # Synthetic (K, G, H) without a checkpoint.

_MODE = flags.DEFINE_enum("mode", "cache", ["cache", "kernel"],
                          "cache: the cache's decode path; kernel: the "
                          "Pallas kernel vs the jnp reference")
_MAX_CONTEXT = flags.DEFINE_integer(
    "max_context", None, "Largest context; default 131072 on GPU/TPU, 16384 "
    "on CPU. Contexts are 1024, 2048, ... doubling up to it.")
_CONTEXTS = flags.DEFINE_list("contexts", [],
                              "Explicit contexts (instead of --max_context).")
_MODEL = flags.DEFINE_string("model", assets.DEFAULT_MODEL,
                             "registered name or checkpoint path (shapes)")
_SHAPE = flags.DEFINE_enum("shape", None, list(SHAPES),
                           "--mode=kernel, instead of --model: 8b = K=8, G=4, "
                           "H=128.")
_BATCH = flags.DEFINE_list("batch", ["1"], "Sequences (a list).")
_KINDS = flags.DEFINE_list("kinds", list(DEFAULT_KINDS),
                           "--mode=cache: bf16, float32, preset names or "
                           "short specs.")
_IMPLEMENTATIONS = flags.DEFINE_list(
    "implementations", ["xla"], "--mode=cache: decode attention of the "
    "quantized caches (xla, pallas).")
_FORMATS = flags.DEFINE_list(
    "formats", ["int8", "int4_g32", "int2_g32"],
    f"--mode=kernel formats: {list(kernel_bench.SPECS)}.")
_PALLAS_INTERPRET = flags.DEFINE_bool(
    "pallas_interpret", False, "On CPU, also run the Pallas kernel in "
    "interpret mode (slow; not a timing).")
_REPEATS = flags.DEFINE_integer("repeats", 10, "Timed repeats (median).")
_BLOCK_K = flags.DEFINE_integer("block_k", 128, "--mode=kernel block_k.")
_JSON = flags.DEFINE_string("json", None, "--mode=cache: also write the rows "
                            "to this file.")


def main(argv):
  log_setup.configure_from_flags()
  del argv
  on_cpu = jax.default_backend() == "cpu"
  contexts = decode_bench.bench_contexts(
      int_list(_CONTEXTS), _MAX_CONTEXT.value or (16384 if on_cpu else 131072))
  batches = int_list(_BATCH)
  print(kernel_bench.machine_description())
  if _MODE.value == "cache":
    config = model_config(_MODEL.value)
    print(f"{_MODEL.value} ({config.name}) layer 0: K={config.num_kv_heads} "
          f"N={config.num_heads} H={config.head_dim}; B={batches}; median "
          f"of {_REPEATS.value}; contexts {contexts}")
    rows = []
    for batch in batches:
      rows += attention_bench.run(
          config, _KINDS.value, contexts, batch_size=batch,
          repeats=_REPEATS.value, implementations=_IMPLEMENTATIONS.value)
    print(decode_bench.format_table(rows))
    if _JSON.value:
      print(f"rows: {decode_bench.write_rows(_JSON.value, _MODEL.value, rows)}")
    return
  if _SHAPE.value:
    source = f"--shape={_SHAPE.value}"
    kv_heads, g, head_dim = SHAPES[_SHAPE.value]
  else:
    config = model_config(_MODEL.value)
    source = f"{_MODEL.value} ({config.name})"
    kv_heads, g, head_dim = (config.num_kv_heads, config.group_size,
                             config.head_dim)
  print(f"{source}: B={batches[0]} K={kv_heads} G={g} H={head_dim}, "
        f"contexts {contexts}")
  rows = kernel_bench.run(
      contexts, batch=batches[0], kv_heads=kv_heads, g=g, head_dim=head_dim,
      formats=_FORMATS.value, pallas=(not on_cpu) or _PALLAS_INTERPRET.value,
      interpret=on_cpu, repeats=_REPEATS.value, block_k=_BLOCK_K.value)
  print(kernel_bench.format_table(rows))


if __name__ == "__main__":
  run_main(main)
