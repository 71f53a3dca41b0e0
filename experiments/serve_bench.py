r"""Serve the same requests with each cache kind from one KV memory budget.

  python -m experiments.serve_bench --kinds=bf16,int8,q4_0,int4_g32_asym \
      --num_requests=64 --prompt_len=128 --output_len=512 \
      --budget_requests=4 --out=runs/serve/decode_tight
  python -m experiments.serve_bench --kv_budget_mib=64 --arrival=poisson:2
  python -m experiments.serve_bench --device_memory_gib=1 --shared_prefix_len=512 \
      --prefix_caching

The budget: --kv_budget_mib, or --device_memory_gib minus the weights, or
--budget_requests=N: the budget in which the first kind holds N
full-length requests. Prompts are windows of --eval_data (default: the
fixed standard-library corpus), fixed length or --lengths=uniform (seeded). Output lengths
are fixed (EOS ignored) unless --stop_at_eos. Details and every column:
kvq_jax/serving/bench.py; outputs: kvq_jax/serving/bench_report.py.
"""

from __future__ import annotations

from absl import app
from absl import flags

from kvq_jax import assets
from kvq_jax.calibration import auto_key_stats
from kvq_jax.cli import log_setup
from kvq_jax.cli.data_flags import DEFINE_eval_data_flag
from kvq_jax.cli.entry import run_main
from kvq_jax.serving import bench_runner

_MODEL = flags.DEFINE_string("model", assets.DEFAULT_MODEL,
                             "registered model name or checkpoint path")
_KINDS = flags.DEFINE_list(
    "kinds", ["bf16", "int8", "q4_0", "int4_g32_asym", "kivi4", "tqmix425"],
    "cache kinds: bf16, float32 or preset names; the first is the baseline")
_BUDGET_MIB = flags.DEFINE_float("kv_budget_mib", None, "KV budget in MiB")
_DEVICE_GIB = flags.DEFINE_float(
    "device_memory_gib", None, "device memory; the weights are subtracted")
_BUDGET_REQUESTS = flags.DEFINE_integer(
    "budget_requests", None, "budget = this many full-length requests of the "
    "first kind")
_NUM = flags.DEFINE_integer("num_requests", 64, "requests")
_PROMPT = flags.DEFINE_integer("prompt_len", 128, "prompt tokens")
_OUTPUT = flags.DEFINE_integer("output_len", 512, "output tokens")
_LENGTHS = flags.DEFINE_enum("lengths", "fixed", ["fixed", "uniform"],
                             "fixed, or uniform in [L/2, 3L/2] (seeded)")
_ARRIVAL = flags.DEFINE_string("arrival", "all", "all | poisson:RATE")
_SLOTS = flags.DEFINE_integer("max_slots", 64, "most requests at once")
_PREFIX = flags.DEFINE_integer("shared_prefix_len", 0,
                               "tokens every prompt shares")
_PREFIX_CACHING = flags.DEFINE_bool("prefix_caching", False,
                                    "share full prompt pages")
_PAGE = flags.DEFINE_integer("page_size", 32, "tokens per page")
_CHUNK = flags.DEFINE_integer("prefill_chunk", 256, "largest prefill chunk")
_SEED = flags.DEFINE_integer("seed", 0, "workload seed")
_EOS = flags.DEFINE_bool("stop_at_eos", False, "stop requests at EOS")
_DATA = DEFINE_eval_data_flag("corpus for the prompts")
_OUT = flags.DEFINE_string("out", "runs/serve/latest", "output folder")


def main(argv):
  log_setup.configure_from_flags()
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  # Key-stats recipes of the kinds resolve for --model on --eval_data
  # (calibration.auto_key_stats).
  auto_key_stats.resolves_for_run(bench_runner.main)(
      model=_MODEL.value, kinds=_KINDS.value, kv_budget_mib=_BUDGET_MIB.value,
      device_memory_gib=_DEVICE_GIB.value,
      budget_requests=_BUDGET_REQUESTS.value, num_requests=_NUM.value,
      prompt_len=_PROMPT.value, output_len=_OUTPUT.value,
      lengths=_LENGTHS.value, arrival=_ARRIVAL.value,
      max_slots=_SLOTS.value, shared_prefix_len=_PREFIX.value,
      prefix_caching=_PREFIX_CACHING.value, page_size=_PAGE.value,
      prefill_chunk=_CHUNK.value, seed=_SEED.value,
      stop_at_eos=_EOS.value, eval_data=_DATA.value, out=_OUT.value)


if __name__ == "__main__":
  run_main(main)
