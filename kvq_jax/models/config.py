"""Architecture hyper-parameters of a llama-family decoder (frozen, hashable)."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """What the decoder needs to know about a checkpoint.

  Field names follow Hugging Face's `LlamaConfig` where one exists, so a
  `config.json` maps onto it almost one to one (see `loaders/hf.py`).
  """

  vocab_size: int
  hidden_size: int
  intermediate_size: int
  num_layers: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  rope_theta: float = 10000.0
  rope_dim: int | None = None  # None: rotate the whole head_dim.
  rms_norm_eps: float = 1e-5
  tie_embeddings: bool = True
  attention_bias: bool = False  # Qwen2-style q/k/v biases.
  max_position_embeddings: int = 8192
  bos_token_id: int | None = None
  eos_token_id: int | None = None
  name: str = "llama"

  def __post_init__(self):
    for field in ("vocab_size", "hidden_size", "intermediate_size",
                  "num_layers", "num_heads", "num_kv_heads", "head_dim"):
      value = getattr(self, field)
      if not isinstance(value, int) or value <= 0:
        raise ValueError(
            f"ModelConfig.{field}={value!r}: must be a positive integer.")
    if self.num_heads % self.num_kv_heads:
      raise ValueError(
          f"ModelConfig.num_heads={self.num_heads} is not a multiple of "
          f"num_kv_heads={self.num_kv_heads}; grouped-query attention needs "
          "num_heads = G * num_kv_heads.")
    rope_dim = self.rotary_dim
    if rope_dim % 2 or not 0 < rope_dim <= self.head_dim:
      raise ValueError(
          f"ModelConfig.rope_dim={self.rope_dim!r}: must be even and in "
          f"(0, head_dim={self.head_dim}].")
    if self.rope_theta <= 0:
      raise ValueError(
          f"ModelConfig.rope_theta={self.rope_theta!r}: must be > 0.")

  @property
  def rotary_dim(self) -> int:
    return self.head_dim if self.rope_dim is None else self.rope_dim

  @property
  def group_size(self) -> int:
    """Query heads per KV head (the GQA ratio)."""
    return self.num_heads // self.num_kv_heads
