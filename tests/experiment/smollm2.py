"""SmolLM2-135M's architecture (the default model), without its weights."""

from __future__ import annotations

from kvq_jax.models.config import ModelConfig

SMOLLM2 = ModelConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536,
                      num_layers=30, num_heads=9, num_kv_heads=3, head_dim=64,
                      rope_theta=100000.0, rms_norm_eps=1e-5,
                      tie_embeddings=True, bos_token_id=1, eos_token_id=2)
