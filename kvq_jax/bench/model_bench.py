"""Compile time and throughput of the jitted decoder on random weights.

  python -m kvq_jax.bench.model_bench [--preset smollm2_135m] [--tokens 512]

Random float32 weights of the real shapes (no checkpoint needed). Reports the
prefill compile time at (B, T), steady-state prefill tokens/s, and decode
tokens/s at batch 1 with a cache of `--tokens` slots.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

from kvq_jax.models.config import ModelConfig
from kvq_jax.models.params import decoder_from_params, random_params
from kvq_jax.models.runtime import Runtime

PRESETS = {
    "smollm2_135m": ModelConfig(
        vocab_size=49152, hidden_size=576, intermediate_size=1536,
        num_layers=30, num_heads=9, num_kv_heads=3, head_dim=64,
        rope_theta=100000.0, rms_norm_eps=1e-5, tie_embeddings=True,
        name="llama"),
}


def run(config: ModelConfig, batch: int, tokens: int, decode_steps: int,
        repeats: int) -> dict[str, float]:
  model = decoder_from_params(config, random_params(config, seed=0))
  runtime = Runtime(model)
  ids = jnp.asarray(np.random.default_rng(0).integers(
      0, config.vocab_size, (batch, tokens)), jnp.int32)

  cache = runtime.init_cache(batch, tokens)
  start = time.perf_counter()
  compiled = runtime.forward_fn.lower(runtime.state, ids, cache,
                                     None).compile()
  compile_s = time.perf_counter() - start
  del compiled
  logits, _ = runtime.prefill(ids, runtime.init_cache(batch, tokens))
  logits.block_until_ready()  # Warm (uses jit's own cache).
  start = time.perf_counter()
  for _ in range(repeats):
    logits, _ = runtime.prefill(ids, runtime.init_cache(batch, tokens))
    logits.block_until_ready()
  prefill_s = (time.perf_counter() - start) / repeats

  cache = runtime.init_cache(1, tokens)
  _, cache = runtime.prefill(ids[:1, :tokens - decode_steps - 1], cache)
  token = ids[:1, 0]
  logits, cache = runtime.decode(token, cache)  # Compile.
  logits.block_until_ready()
  start = time.perf_counter()
  for _ in range(decode_steps):
    logits, cache = runtime.decode(token, cache)
  logits.block_until_ready()
  decode_s = (time.perf_counter() - start) / decode_steps
  return {"compile_s": compile_s,
          "prefill_tok_per_s": batch * tokens / prefill_s,
          "prefill_s": prefill_s,
          "decode_tok_per_s": 1.0 / decode_s}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument("--preset", default="smollm2_135m", choices=PRESETS)
  parser.add_argument("--batch", type=int, default=1)
  parser.add_argument("--tokens", type=int, default=512)
  parser.add_argument("--decode_steps", type=int, default=32)
  parser.add_argument("--repeats", type=int, default=3)
  args = parser.parse_args()
  print(f"jax {jax.__version__} on {jax.devices()}")
  result = run(PRESETS[args.preset], args.batch, args.tokens,
               args.decode_steps, args.repeats)
  for key, value in result.items():
    print(f"{key}: {value:.3f}")


if __name__ == "__main__":
  main()
