"""Named architectures by their published config numbers alone (no file).

Capacity planning needs only shapes: layers, kv heads and head_dim price
the cache; hidden, intermediate, query heads and vocabulary price the
weights (`memory.num_params`). Each entry builds a full `ModelConfig` from
the model's published Hugging Face `config.json`, so every function of
`capacity.memory` works on it as on a loaded model. What a `ModelConfig`
cannot hold (Llama 3.1's 'llama3' RoPE scaling, Qwen2's unused sliding
window) changes no byte and is left out.

`params_published` is the parameter count the model card states; a test
checks `memory.num_params(config)` against it (the weights this module
prices are computed from the config, not taken from the card).
"""

from __future__ import annotations

import dataclasses

from kvq_jax.models.config import ModelConfig


@dataclasses.dataclass(frozen=True)
class Architecture:
  """A named architecture: its config and where the numbers come from.

  Attributes:
    name: the name `--model` takes, e.g. 'llama-3.1-8b'.
    config: the full ModelConfig (shapes of the published checkpoint).
    params_published: the parameter count of the model card.
    source: the checkpoint whose config.json the numbers are from.
  """

  name: str
  config: ModelConfig
  params_published: float
  source: str


_LLAMA_3_1 = dict(vocab_size=128256, num_kv_heads=8, head_dim=128,
                  rope_theta=500000.0, rms_norm_eps=1e-5,
                  tie_embeddings=False, max_position_embeddings=131072,
                  bos_token_id=128000, eos_token_id=128001, name="llama")

ARCHITECTURES: dict[str, Architecture] = {
    "llama-3.1-8b": Architecture(
        name="llama-3.1-8b",
        config=ModelConfig(hidden_size=4096, intermediate_size=14336,
                           num_layers=32, num_heads=32, **_LLAMA_3_1),
        params_published=8.03e9, source="meta-llama/Llama-3.1-8B"),
    "llama-3.1-70b": Architecture(
        name="llama-3.1-70b",
        config=ModelConfig(hidden_size=8192, intermediate_size=28672,
                           num_layers=80, num_heads=64, **_LLAMA_3_1),
        params_published=70.6e9, source="meta-llama/Llama-3.1-70B"),
    # The base model's config (131072 positions); Qwen2.5-7B-Instruct's
    # says 32768 (131072 with YaRN). Shapes are the same.
    "qwen2.5-7b": Architecture(
        name="qwen2.5-7b",
        config=ModelConfig(vocab_size=152064, hidden_size=3584,
                           intermediate_size=18944, num_layers=28,
                           num_heads=28, num_kv_heads=4, head_dim=128,
                           rope_theta=1000000.0, rms_norm_eps=1e-6,
                           tie_embeddings=False, attention_bias=True,
                           max_position_embeddings=131072,
                           bos_token_id=151643, eos_token_id=151643,
                           name="qwen2"),
        params_published=7.62e9, source="Qwen/Qwen2.5-7B"),
}


def architecture_names() -> list[str]:
  return sorted(ARCHITECTURES)


def get_architecture(name: str) -> Architecture:
  """The named architecture; ValueError listing the names allowed."""
  if name not in ARCHITECTURES:
    raise ValueError(f"architecture={name!r} is unknown; allowed: "
                     f"{', '.join(architecture_names())}.")
  return ARCHITECTURES[name]
