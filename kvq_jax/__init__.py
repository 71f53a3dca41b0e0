"""kvq_jax: KV-cache quantization research in JAX/Pallas.

Stable facade (see WORKSPACE.md):
  model = kvq_jax.load_model("smollm2-135m")      # or a .gguf / HF directory
  logits = kvq_jax.forward_logits(model, ids_BxT)  # float32 numpy [B, T, V]
  config = kvq_jax.model_config("gemma3-270m")     # shapes only, no weights
"""

from __future__ import annotations

__version__ = "0.1.0"


def load_model(name_or_path="smollm2-135m", dtype="float32"):
  from kvq_jax import facade  # Lazy: importing kvq_jax stays cheap.
  return facade.load_model(name_or_path, dtype)


def model_config(name_or_path="smollm2-135m"):
  from kvq_jax import facade
  return facade.model_config(name_or_path)


def forward_logits(model, ids):
  from kvq_jax import facade
  return facade.forward_logits(model, ids)


__all__ = ["load_model", "model_config", "forward_logits", "__version__"]
