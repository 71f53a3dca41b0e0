"""Tiny llama configs for the decoder tests (D=64, N=4, K=2, H=16, V=97)."""

from __future__ import annotations

from kvq_jax.models.config import ModelConfig

TINY = ModelConfig(vocab_size=97, hidden_size=64, intermediate_size=128,
                   num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
                   rope_theta=10000.0, rms_norm_eps=1e-5)
# Qwen2-like variant: q/k/v biases, untied head, partial rotary dim.
TINY_BIAS_UNTIED = ModelConfig(
    vocab_size=97, hidden_size=64, intermediate_size=128, num_layers=2,
    num_heads=4, num_kv_heads=2, head_dim=16, rope_dim=8, rope_theta=500.0,
    rms_norm_eps=1e-6, tie_embeddings=False, attention_bias=True)
