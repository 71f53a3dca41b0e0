"""Decode-attention benchmark: time and effective bandwidth vs context length.

Effective bandwidth = bytes of the K and V cache as stored (packed codes plus
scales plus zero points, or the dense bf16 arrays) / median time. The query,
lengths and output are negligible at decode.
"""

from __future__ import annotations

import dataclasses
import os
import platform
from typing import Callable, Sequence

import jax
import jax.numpy as jnp

from kvq_jax.bench.decode_bench import leaf_bytes
from kvq_jax.bench.timing import time_fn
from kvq_jax.kernels.decode_attention import decode_attention
from kvq_jax.kernels.decode_attention import decode_attention_dense
from kvq_jax.kernels.reference import decode_attention_reference
from kvq_jax.quant import QuantSpec, quantize

SPECS = {
    "int8": QuantSpec("int8", "symmetric", "per_token"),
    "int4_g32": QuantSpec("int4", "symmetric", "per_group", 32),
    "int2_g32": QuantSpec("int2", "asymmetric", "per_group", 32),
}


@dataclasses.dataclass(frozen=True)
class Row:
  context: int
  method: str
  seconds: float
  nbytes: int

  @property
  def gbps(self) -> float:
    return self.nbytes / self.seconds / 1e9


def machine_description() -> str:
  return (f"jax {jax.__version__}, backend={jax.default_backend()}, "
          f"devices={jax.devices()}, cpu={platform.processor() or '?'} "
          f"({os.cpu_count()} cores), {platform.platform()}")


def run(contexts: Sequence[int], *, batch: int, kv_heads: int, g: int,
        head_dim: int, formats: Sequence[str], pallas: bool,
        interpret: bool, repeats: int, block_k: int = 128,
        log: Callable[[str], None] = print) -> list[Row]:
  """Times every method at every context (length = capacity = context)."""
  xla_ref = jax.jit(decode_attention_reference)
  rows = []
  for context in contexts:
    kq, kk, kv = jax.random.split(jax.random.PRNGKey(context), 3)
    shape = (batch, kv_heads, context, head_dim)
    q = jax.random.normal(kq, (batch, kv_heads, g, head_dim), jnp.bfloat16)
    k = jax.random.normal(kk, shape, jnp.bfloat16)
    v = jax.random.normal(kv, shape, jnp.bfloat16)
    length = jnp.full((batch,), context, jnp.int32)
    caches = {"bf16": (k, v)}
    for name in formats:
      caches[name] = (quantize(k, SPECS[name]), quantize(v, SPECS[name]))
    for name, (kc, vc) in caches.items():
      methods = {f"xla_{name}": lambda kc=kc, vc=vc: xla_ref(q, kc, vc,
                                                             length)}
      if pallas:
        kernel = decode_attention_dense if name == "bf16" else decode_attention
        methods[f"pallas_{name}"] = (
            lambda kc=kc, vc=vc, kernel=kernel: kernel(
                q, kc, vc, length, block_k=block_k, interpret=interpret))
      for method, fn in methods.items():
        seconds = time_fn(fn, repeats=repeats)
        row = Row(context, method, seconds, leaf_bytes((kc, vc)))
        log(f"  {context:>7} {method:<18} {seconds * 1e3:9.3f} ms "
            f"{row.gbps:8.2f} GB/s")
        rows.append(row)
  return rows


def format_table(rows: Sequence[Row]) -> str:
  """Markdown table: one row per context, time (ms) / GB/s per method."""
  methods = list(dict.fromkeys(r.method for r in rows))
  contexts = sorted({r.context for r in rows})
  by_key = {(r.context, r.method): r for r in rows}
  lines = ["| context | " + " | ".join(methods) + " |",
           "|---" * (len(methods) + 1) + "|"]
  for c in contexts:
    cells = []
    for m in methods:
      r = by_key.get((c, m))
      cells.append("-" if r is None else
                   f"{r.seconds * 1e3:.3f} ms / {r.gbps:.2f} GB/s")
    lines.append(f"| {c} | " + " | ".join(cells) + " |")
  return "\n".join(lines)
