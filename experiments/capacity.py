r"""Sessions and context a device's memory holds, per cache kind (no weights).

  python -m experiments.capacity --model=llama-3.1-70b \
      --device_memory_gib=80 --weight_bytes_per_param=1 [--context=8192] \
      [--concurrency=1] [--kinds=bf16,fp8_e4m3,int8,...] [--overhead_gib=0] \
      [--out=capacity.json]

--model: an architecture by its published config numbers (llama-3.1-8b,
llama-3.1-70b, qwen2.5-7b: kvq_jax/capacity/architectures.py), a
registered model (its file's metadata) or a model path. KV budget = device
memory - num_params * weight bytes - overhead; per kind: effective bits at
--context, KV bytes per token, the most requests of --context tokens, the
longest context for --concurrency requests (kvq_jax/serving/capacity_plan.py).
Kinds: bf16, float32, any preset in configs/ or a short spec
(kvq_jax/settings/kinds.py).
"""

from absl import app
from absl import flags

from kvq_jax.cli import log_setup
from kvq_jax.cli.entry import run_main
from kvq_jax.serving.capacity_plan import (DEFAULT_KINDS, CapacityRequest,
                                           run_capacity)

_MODEL = flags.DEFINE_string(
    "model", None, "architecture (llama-3.1-8b, llama-3.1-70b, qwen2.5-7b), "
    "registered model or path", required=True)
_DEVICE = flags.DEFINE_float("device_memory_gib", None,
                             "device memory, GiB (2^30 B)", required=True)
_WEIGHT_BYTES = flags.DEFINE_float(
    "weight_bytes_per_param", 2.0, "2 for bf16 weights, 1 for fp8 / int8")
_CONTEXT = flags.DEFINE_integer(
    "context", 8192, "tokens per request, for the maximum concurrency")
_CONCURRENCY = flags.DEFINE_integer(
    "concurrency", 1, "requests, for the maximum context per request")
_KINDS = flags.DEFINE_list("kinds", list(DEFAULT_KINDS),
                           "cache kinds: bf16, float32, preset names or "
                           "short specs")
_OVERHEAD = flags.DEFINE_float(
    "overhead_gib", 0.0, "activations / runtime reserve off the budget, GiB")
_OUT = flags.DEFINE_string("out", None, "JSON output path (optional)")

def main(argv):
  log_setup.configure_from_flags()
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  run_capacity(CapacityRequest(
      model=_MODEL.value, device_memory_gib=_DEVICE.value,
      weight_bytes_per_param=_WEIGHT_BYTES.value, context=_CONTEXT.value,
      concurrency=_CONCURRENCY.value, kinds=tuple(_KINDS.value),
      overhead_gib=_OVERHEAD.value), out=_OUT.value)


if __name__ == "__main__":
  run_main(main)
