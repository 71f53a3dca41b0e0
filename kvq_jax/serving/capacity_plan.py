"""What a device's memory holds: sessions at a context, context per session.

`experiments.capacity`'s library call. For a model (a named architecture
of `capacity.architectures`, a registered model or a model path, read from
its file's metadata: `facade.model_config`) and cache kinds
(`settings.kinds.resolve_kind` priced on that model: `capacity.kinds`) on
a device of D GiB with weights at w bytes per parameter and an overhead
reserve O GiB (activations, runtime; not modelled, 0 by default):

    KV budget B = D - num_params * w - O                      (bytes)
    max concurrency at context L = floor(B / bytes(L))
    max context at concurrency N = the largest T with bytes(T) <= B / N

bytes(T) is `memory.effective_bytes`: what one request of T tokens holds,
read off the real cache pytree (codes, scales, zeros, full-precision
windows and sinks, per-layer constants, sliding-window rings), so a kind
with a residual window pays for it per request. No weight is loaded and
nothing is allocated.

Not modelled: tokens are counted exactly (a paged cache rounds each
request up to whole pages; nothing is lost at a context that is a multiple
of the page size), the prompt's activations and the runtime's reserve (give
them as --overhead_gib), and any cap other than memory (a scheduler's
maximum batch, compute or latency targets). The maximum context is not
capped at the model's trained positions; the plan notes where it is above.

Bad input fails before any cache is traced: numbers out of range, an
unknown model or kind, a kind that does not fit the model, weights (plus
the overhead) that do not fit the device.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import pathlib

import jax.numpy as jnp

from kvq_jax import assets
from kvq_jax import facade
from kvq_jax.capacity import memory
from kvq_jax.capacity.architectures import ARCHITECTURES, architecture_names
from kvq_jax.models.config import ModelConfig
from kvq_jax.settings.kinds import Kind, resolve_kind

GIB = 2**30
DEFAULT_KINDS = ("bf16", "fp8_e4m3", "int8", "q8_0", "q4_0", "kivi4",
                 "kivi2", "int4_g32_asym", "tqmix425")


@dataclasses.dataclass(frozen=True)
class CapacityRequest:
  """What to plan. Numbers are validated here (ValueError naming the field).

  Attributes:
    model: an architecture name, a registered model name or a model path.
    device_memory_gib: the device's memory, GiB (2^30 bytes).
    weight_bytes_per_param: 2 for bf16 weights, 1 for fp8 / int8, ...
    context: tokens per request for the maximum concurrency.
    concurrency: requests for the maximum context (each gets B / N).
    kinds: cache kinds (`settings.kinds`: bf16, float32, a preset or a
      short spec).
    overhead_gib: activations / runtime reserve taken off the budget.
  """

  model: str
  device_memory_gib: float
  weight_bytes_per_param: float = 2.0
  context: int = 8192
  concurrency: int = 1
  kinds: tuple[str, ...] = DEFAULT_KINDS
  overhead_gib: float = 0.0

  def __post_init__(self):
    if not isinstance(self.model, str) or not self.model:
      raise ValueError(f"model={self.model!r}: allowed: an architecture "
                       f"({', '.join(architecture_names())}), a registered "
                       "model name or a model path.")
    for field in ("device_memory_gib", "weight_bytes_per_param"):
      _number(getattr(self, field), field, positive=True)
    _number(self.overhead_gib, "overhead_gib", positive=False)
    for field in ("context", "concurrency"):
      value = getattr(self, field)
      if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{field}={value!r}: allowed: an integer >= 1.")
    kinds = (tuple(self.kinds) if isinstance(self.kinds, (list, tuple))
             else None)
    if (not kinds or any(not isinstance(k, str) or not k for k in kinds)
        or len(set(kinds)) != len(kinds)):
      raise ValueError(f"kinds={self.kinds!r}: allowed: a non-empty list of "
                       "distinct kind names (bf16, float32 or presets).")
    object.__setattr__(self, "kinds", kinds)


def _number(value, field: str, *, positive: bool) -> None:
  if (isinstance(value, bool) or not isinstance(value, (int, float))
      or not math.isfinite(value) or value < 0 or (positive and value == 0)):
    raise ValueError(f"{field}={value!r}: allowed: a finite number "
                     f"{'> 0' if positive else '>= 0'}.")


@dataclasses.dataclass(frozen=True)
class KindCapacity:
  """One kind's row of the plan (bytes, per request).

  Attributes:
    kind, dtype: the kind's name and full-precision dtype.
    effective_bits: bits per K/V element held at the request's context.
    stored_bits: the packed formats' bits alone (`memory.theoretical_bits`).
    kv_bytes_per_token: stored bytes per token of the layers whose cost
      grows with the context (beyond the full-precision windows).
    kv_fixed_bytes_per_sequence: what a request holds whatever its length
      (windows, sinks, constants, sliding-window rings).
    kv_bytes_per_sequence: one request's bytes at the context.
    vs_bf16: a bf16 cache's bytes at the context / this kind's.
    max_concurrency: requests of `context` tokens in the budget.
    max_context: tokens per request with `concurrency` requests.
    full_precision: what the cache keeps unquantized, in words.
    note: how the kind was priced (`capacity.kinds`), '' if as the preset.
  """

  kind: str
  dtype: str
  effective_bits: float
  stored_bits: float
  kv_bytes_per_token: float
  kv_fixed_bytes_per_sequence: int
  kv_bytes_per_sequence: int
  vs_bf16: float
  max_concurrency: int
  max_context: int
  full_precision: str
  note: str


@dataclasses.dataclass(frozen=True)
class CapacityPlan:
  """The plan: the model, the budget and one row per kind."""

  request: CapacityRequest
  source: str
  num_layers: int
  num_kv_heads: int
  head_dim: int
  num_params: int
  max_position_embeddings: int
  device_memory_bytes: int
  weight_bytes: float
  overhead_bytes: int
  kv_budget_bytes: int
  rows: tuple[KindCapacity, ...]
  notes: tuple[str, ...]

  def to_json(self) -> dict:
    out = dataclasses.asdict(self)
    out["request"]["kinds"] = list(self.request.kinds)
    return out


def resolve_model(name: str) -> tuple[ModelConfig, str]:
  """(config, where it comes from): an architecture, a registered model
  (its file's metadata; fetched once if not cached) or a model path."""
  if name in ARCHITECTURES:
    arch = ARCHITECTURES[name]
    return arch.config, (f"architecture {name}: config numbers of "
                         f"{arch.source}")
  if name in assets.REGISTRY:
    return (facade.model_config(name),
            f"registered model {name}: its file's metadata")
  if os.path.exists(os.path.expanduser(name)):
    return facade.model_config(name), f"model at {name}"
  raise ValueError(
      f"model={name!r} is unknown; allowed: an architecture "
      f"({', '.join(architecture_names())}), a registered model "
      f"({', '.join(sorted(assets.REGISTRY))}) or an existing .gguf / "
      "Hugging Face model path.")


def plan_capacity(request: CapacityRequest) -> CapacityPlan:
  """Every kind's capacity (module docstring); validation comes first."""
  config, source = resolve_model(request.model)
  kinds = [resolve_kind(name, model=config, what="--kinds item")
           for name in request.kinds]
  params = memory.num_params(config)
  weights = params * request.weight_bytes_per_param
  device = int(request.device_memory_gib * GIB)
  overhead = int(math.ceil(request.overhead_gib * GIB))
  budget = int(device - weights - overhead)
  if budget <= 0:
    raise ValueError(
        f"device_memory_gib={request.device_memory_gib:g}: the weights "
        f"({params / 1e9:.2f}e9 params x {request.weight_bytes_per_param:g} "
        f"B = {weights / GIB:.2f} GiB) plus overhead_gib="
        f"{request.overhead_gib:g} leave no memory for the KV cache; "
        "allowed: a larger device, fewer weight bytes per parameter or a "
        "smaller overhead.")
  bf16 = memory.effective_bytes(config, None, jnp.bfloat16, request.context)
  rows = tuple(_row(config, kind, budget, request, bf16) for kind in kinds)
  return CapacityPlan(
      request=request, source=source, num_layers=config.num_layers,
      num_kv_heads=config.num_kv_heads, head_dim=config.head_dim,
      num_params=params,
      max_position_embeddings=config.max_position_embeddings,
      device_memory_bytes=device, weight_bytes=weights,
      overhead_bytes=overhead, kv_budget_bytes=budget, rows=rows,
      notes=_notes(config, request, rows))


def _row(config: ModelConfig, kind: Kind, budget: int,
         request: CapacityRequest, bf16_bytes: int) -> KindCapacity:
  dtype = jnp.dtype(kind.dtype)
  at = memory.effective_bytes(config, kind.spec, dtype, request.context)
  split = memory.cost_split(config, kind.spec, dtype)
  return KindCapacity(
      kind=kind.name, dtype=kind.dtype,
      effective_bits=memory.effective_bits(config, kind.spec, dtype,
                                           request.context),
      stored_bits=memory.theoretical_bits(config, kind.spec, dtype),
      kv_bytes_per_token=split.global_bytes_per_token,
      kv_fixed_bytes_per_sequence=(split.global_fixed_bytes
                                   + split.local_bytes),
      kv_bytes_per_sequence=at, vs_bf16=bf16_bytes / at,
      max_concurrency=budget // at,
      max_context=memory.max_context(config, kind.spec, dtype,
                                     budget / request.concurrency),
      full_precision=memory.full_precision_note(config, kind.spec),
      note=kind.note)


def _notes(config: ModelConfig, request: CapacityRequest,
           rows: tuple[KindCapacity, ...]) -> tuple[str, ...]:
  limit = config.max_position_embeddings
  notes = [f"overhead {request.overhead_gib:g} GiB reserved for "
           "activations / runtime (not modelled)",
           "tokens counted exactly: a paged cache rounds each request up "
           "to whole pages; no cap but memory (no scheduler batch limit)"]
  if request.context > limit:
    notes.append(f"context {request.context} is above the model's "
                 f"max_position_embeddings {limit}")
  above = [r.kind for r in rows if r.max_context > limit]
  if above:
    notes.append(f"max context above the model's max_position_embeddings "
                 f"{limit} (not capped): {', '.join(above)}")
  return tuple(notes)


def format_plan(plan: CapacityPlan) -> str:
  """The plan as plain text: a header and one table row per kind."""
  r = plan.request
  lines = [
      f"model {r.model} ({plan.source}): {plan.num_layers} layers, "
      f"{plan.num_kv_heads} kv heads, head_dim {plan.head_dim}, "
      f"{plan.num_params / 1e9:.2f}e9 params, max position "
      f"{plan.max_position_embeddings}",
      f"device {r.device_memory_gib:g} GiB - weights "
      f"{plan.weight_bytes / GIB:.2f} GiB ({r.weight_bytes_per_param:g} "
      f"B/param) - overhead {r.overhead_gib:g} GiB = KV budget "
      f"{plan.kv_budget_bytes / GIB:.2f} GiB ({plan.kv_budget_bytes} B)",
      f"L = {r.context} tokens per request; N = {r.concurrency} requests",
      "",
      f"| kind | bits @L | KV B/token | MiB/request @L | x bf16 | "
      f"max requests @L | max context @N |",
      "|---|---|---|---|---|---|---|"]
  for row in plan.rows:
    lines.append(
        f"| {row.kind} | {row.effective_bits:.3f} | "
        f"{row.kv_bytes_per_token:,.0f} | "
        f"{row.kv_bytes_per_sequence / 2**20:,.1f} | {row.vs_bf16:.2f} | "
        f"{row.max_concurrency} | {row.max_context:,} |")
  lines.append("")
  lines += [f"note: {n}" for n in plan.notes]
  lines += [f"note: {row.kind}: {row.note}" for row in plan.rows if row.note]
  return "\n".join(lines)


def run_capacity(request: CapacityRequest,
                 out: str | None = None) -> CapacityPlan:
  """Plans, prints the table and writes the plan's JSON to `out` if set."""
  if out is not None and pathlib.Path(out).is_dir():
    raise ValueError(f"out={out!r} is a directory; allowed: a file path.")
  plan = plan_capacity(request)
  print(format_plan(plan))
  if out is not None:
    path = pathlib.Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(plan.to_json(), indent=1) + "\n")
    print(f"wrote {path}")
  return plan
