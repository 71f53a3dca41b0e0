r"""Where one layer's decode-step storage read spends its time.

  python -m experiments.profile_read --kinds=bf16,float32,int8,q4_0 \
      --contexts=4096,16384 [--block=256] [--repeats=7] [--json=FILE]

Per kind and context: the slice + dequantize work alone ("read"), the
block-attention loop as the cache runs it ("attend") and dequantizing
every format ("attend, dequantized"), with the bytes the step reads and
the bandwidth they imply (`kvq_jax.bench.read_profile`). Synthetic
K/V in SmolLM2's layer shapes (K = 3, G = 3, H = 64), batch 1.
"""

from absl import app
from absl import flags

from kvq_jax.bench.read_profile import profile_storage_read
from kvq_jax.bench.timing import machine_description, write_measured
from kvq_jax.cli import log_setup
from kvq_jax.cli.data_flags import int_list
from kvq_jax.cli.entry import run_main

_KINDS = flags.DEFINE_list("kinds", ["bf16", "float32", "int8", "q4_0"],
                           "bf16, float32 or short format names.")
_CONTEXTS = flags.DEFINE_list("contexts", ["4096", "16384"],
                              "Tokens held (multiples of 256).")
_REPEATS = flags.DEFINE_integer("repeats", 7, "Timed repeats (median).")
_BLOCK = flags.DEFINE_integer("block", 256, "Tokens per loop iteration (the "
                              "cache's block_size; 256 by default).")
_JSON = flags.DEFINE_string("json", None, "Also write the rows here.")


def main(argv):
  log_setup.configure_from_flags()
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  print(machine_description())
  rows = []
  for context in int_list(_CONTEXTS):
    rows += profile_storage_read(_KINDS.value, context, block=_BLOCK.value,
                                 repeats=_REPEATS.value)
  print("| context | kind | bytes read (KiB) | read ms (GB/s) "
        "| attend ms (GB/s) | attend, dequantized ms |")
  print("|---:|---|---:|---:|---:|---:|")
  for r in rows:
    print(f"| {r['context']} | {r['kind']} | {r['bytes_read'] / 1024:.0f} "
          f"| {r['read_ms']:.2f} ({r['read_gbps']:.2f}) "
          f"| {r['attend_ms']:.2f} ({r['attend_gbps']:.2f}) "
          f"| {r['attend_dequantized_ms']:.2f} |")
  if _JSON.value:
    print(f"rows: {write_measured(_JSON.value, {'rows': rows})}")


if __name__ == "__main__":
  run_main(main)
