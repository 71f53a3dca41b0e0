"""`lm_eval --model kvq_jax`: registers `KvqJaxLM` with lm-evaluation-harness.

Importing this module needs lm-eval (the optional extra `kvq_jax[lmeval]`;
lm-eval 0.4.13 needs no torch, but datasets, pyarrow, pandas, scikit-learn);
nothing else in kvq_jax imports it.
`python -m experiments.lm_eval ...` imports it and hands the command line
to lm-eval's own CLI:

  python -m experiments.lm_eval --model kvq_jax \
      --model_args model=qwen2.5-coder-0.5b,config=int4_g32_asym \
      --tasks TASK [--include_path DIR_WITH_YAMLS]

model_args: model (a registered name or checkpoint path; default: the
preset's), config (a preset name or file; default int4_g32), baseline
(true: the full-precision cache in the preset's cache dtype instead of its
quantized one; default false), batch (requests the
engine serves at once in generate_until, 8), max_length (tokens per
window, 2048), max_gen_toks (256). The calls themselves:
`lm_adapter.CacheLM`.
"""

from __future__ import annotations

from lm_eval.api.model import LM
from lm_eval.api.registry import register_model

from kvq_jax.calibration import auto_key_stats
from kvq_jax.facade import load_model
from kvq_jax.settings.experiment_settings import settings_from_config
from kvq_jax.settings.presets import load_preset
from kvq_jax.tasks.lm_adapter import CacheLM



def _flag(value) -> bool:
  if isinstance(value, bool):
    return value
  if str(value).lower() in ("true", "1", "yes"):
    return True
  if str(value).lower() in ("false", "0", "no"):
    return False
  raise ValueError(f"model_args baseline={value!r}: allowed: true, false.")


@auto_key_stats.resolves_for_run
def build(model: str | None = None, config: str = "int4_g32",
          baseline=False, batch: int = 8, max_length: int = 2048,
          max_gen_toks: int = 256) -> CacheLM:
  """The `CacheLM` that `model_args` describe."""
  settings = settings_from_config(load_preset(config))
  quantized = settings.quantize and not _flag(baseline)
  spec = settings.cache_spec if quantized else None
  lm = load_model(model or settings.model, settings.dtype)
  return CacheLM(lm, spec, settings.cache_dtype, max_length=int(max_length),
                 batch=int(batch), max_gen_toks=int(max_gen_toks))


@register_model("kvq_jax")
class KvqJaxLM(LM):
  """lm-eval's LM over `CacheLM` (its requests' `.args` are the tuples)."""

  def __init__(self, batch_size=None, max_batch_size=None, device=None,
               **model_args):
    # lm-eval adds --batch_size, --max_batch_size and --device to the
    # model_args; JAX picks its own device, and an integer batch size is
    # the engine's batch unless model_args gave `batch`.
    del max_batch_size, device
    if isinstance(batch_size, int) and "batch" not in model_args:
      model_args["batch"] = batch_size
    super().__init__()
    self.impl = build(**model_args)

  def loglikelihood(self, requests):
    return self.impl.loglikelihood([r.args for r in requests])

  def loglikelihood_rolling(self, requests):
    return self.impl.loglikelihood_rolling([r.args for r in requests])

  def generate_until(self, requests):
    return self.impl.generate_until([r.args for r in requests])
