"""Architecture hyper-parameters of a decoder (frozen, hashable).

`name` selects the architecture family: 'llama' and 'qwen2' share
`models.decoder.Decoder`; 'gemma3' is `models.gemma3.Gemma3Decoder`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

# Values `ModelConfig.name` may take (see `models.params.decoder_class`).
ARCHITECTURES = ("llama", "qwen2", "gemma3")


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
  # Sliding-window (local) attention, Gemma 3 style: query i of a layer listed
  # in `local_layers` sees tokens j with i - sliding_window < j <= i only.
  sliding_window: int | None = None
  local_layers: tuple[int, ...] = ()
  rope_local_theta: float | None = None  # RoPE base on local layers.
  # Attention logits are q.k / sqrt(query_pre_attn_scalar); None: head_dim.
  query_pre_attn_scalar: float | None = None
  # logits <- c * tanh(logits / c) when set (Gemma 2 style; None: off).
  final_logit_softcapping: float | None = None

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
    if not isinstance(self.local_layers, tuple) or any(
        not isinstance(i, int) or not 0 <= i < self.num_layers
        for i in self.local_layers):
      raise ValueError(
          f"ModelConfig.local_layers={self.local_layers!r}: must be a tuple of "
          f"layer indices in [0, num_layers={self.num_layers}).")
    if self.local_layers and (not isinstance(self.sliding_window, int)
                              or self.sliding_window <= 0):
      raise ValueError(
          f"ModelConfig.sliding_window={self.sliding_window!r}: local_layers "
          "are set, so it must be a positive integer.")
    if self.rope_theta <= 0:
      raise ValueError(
          f"ModelConfig.rope_theta={self.rope_theta!r}: must be > 0.")
    if self.name not in ARCHITECTURES:
      raise ValueError(
          f"ModelConfig.name={self.name!r}: allowed architectures are "
          f"{list(ARCHITECTURES)}.")
    for field in ("rope_local_theta", "query_pre_attn_scalar",
                  "final_logit_softcapping"):
      value = getattr(self, field)
      if value is not None and (isinstance(value, bool)
                                or not isinstance(value, (int, float))
                                or not value > 0):
        raise ValueError(
            f"ModelConfig.{field}={value!r}: must be None or a number > 0.")

  def check_context(self, num_tokens: int, what: str) -> None:
    """Raises ValueError when `num_tokens` positions exceed the model's
    trained ones (`max_position_embeddings`).

    The one check of a length against the model's limit: every script calls
    it as soon as the config is known, before anything is compiled. `what`
    names the setting in the message (e.g. '--contexts=16384').
    """
    limit = self.max_position_embeddings
    if num_tokens > limit:
      raise ValueError(
          f"{what}: {num_tokens} tokens exceed the model's "
          f"max_position_embeddings={limit}; allowed: at most {limit} tokens "
          "(positions past the trained range measure the model's RoPE "
          "extrapolation, not the cache).")

  @property
  def rotary_dim(self) -> int:
    return self.head_dim if self.rope_dim is None else self.rope_dim

  def layer_window(self, index: int) -> int | None:
    """The sliding window of layer `index`, or None for global attention."""
    return self.sliding_window if index in self.local_layers else None

  def layer_rope_theta(self, index: int) -> float:
    """RoPE base of layer `index` (local layers may use their own)."""
    if index in self.local_layers and self.rope_local_theta is not None:
      return self.rope_local_theta
    return self.rope_theta

  @property
  def query_scale(self) -> float:
    """Multiplier of q.k in the attention logits."""
    scalar = (self.head_dim if self.query_pre_attn_scalar is None
              else self.query_pre_attn_scalar)
    return float(scalar) ** -0.5

  @classmethod
  def from_dict(cls, fields: Mapping[str, Any]) -> ModelConfig:
    """Inverse of `dataclasses.asdict` after a JSON round trip (lists that
    were tuples become tuples again, so the config stays hashable)."""
    fields = dict(fields)
    if isinstance(fields.get("local_layers"), list):
      fields["local_layers"] = tuple(fields["local_layers"])
    return cls(**fields)

  @property
  def group_size(self) -> int:
    """Query heads per KV head (the GQA ratio)."""
    return self.num_heads // self.num_kv_heads
