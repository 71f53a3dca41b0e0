"""settings.kinds.resolve_kind: the one resolver of a cache kind by name.

The expected values were computed once with the three resolvers it
replaces (bench.kinds.resolve_kind, capacity.kinds.resolve_kind with its
Catalog, sweep.points.parse_point; commit b5cd045) and pasted here: a spec
is compared through `_digest`, a hash of every CacheSpec field that differs
from its default (QuantSpec fields likewise; key affines by their repr).
"""

from __future__ import annotations

import dataclasses
import hashlib

import pytest

from kvq_jax.cache.spec import CacheSpec
from kvq_jax.capacity.architectures import ARCHITECTURES
from kvq_jax.settings.kinds import Kind, resolve_kind
from kvq_jax.settings.presets import CONFIG_DIR
from kvq_jax.settings.short_specs import parse_short_spec
from kvq_jax.sweep.points import parse_point


def _changed(obj) -> dict:
  return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)
          if getattr(obj, f.name) != f.default}


def _quant(spec):
  return None if spec is None else tuple(sorted(_changed(spec).items()))


def _digest(spec: CacheSpec | None) -> str | None:
  if spec is None:
    return None
  fields = {}
  for name, value in sorted(_changed(spec).items()):
    if name in ("k", "v"):
      value = _quant(value)
    elif name == "layer_overrides":
      value = tuple((i, _quant(k), _quant(v)) for i, k, v in value)
    elif name == "key_affines":
      value = (len(value),
               hashlib.sha256(repr(value).encode()).hexdigest()[:16])
    fields[name] = value
  summary = repr(tuple(sorted(fields.items())))
  return hashlib.sha256(summary.encode()).hexdigest()[:12]


def _path(name: str) -> str:
  return name.replace("CONFIGS", str(CONFIG_DIR))


# bench.kinds.resolve_kind(name) -> (spec, dtype); None: ValueError.
BENCH = {
    "bf16": (None, "bfloat16"),
    "float32": (None, "float32"),
    "int8": ("3c876c7f6f92", "float32"),
    "q4_0": ("b1885908b9d3", "float32"),
    "kivi2": ("0e740d992195", "float32"),
    "kvq4": ("8681ec37bbad", "float32"),
    "fp16": (None, "float16"),
    "baseline": (None, "float32"),
    "k8v4": ("189056a28885", "float32"),
    "int4_g32_asym": ("5cfb5da77545", "float32"),
    "fp8_e4m3": ("1750b9ada385", "float32"),
    "q8_0": ("879434dfaf88", "float32"),
    "kivi4": ("a05602e418f2", "float32"),
    "int2_g32_asym": ("431f473bca05", "float32"),
    "CONFIGS/formats/kivi4.py": ("a05602e418f2", "float32"),
    "tq4": None,  # A key-stats recipe outside a run.
    "int7": None,
}

_STD = "key stats auto not loaded: stand-in of this model's shape (std mode)"
_OVERRIDES = "per-layer formats by layer index, as the preset names them"
_TRANSFORM = ("key stats auto:mode=transform,rotation=pca not loaded: "
              "stand-in of this model's shape (transform mode, rotated), "
              "memory only")
_CHANNELS = ("key stats auto:mode=transform not loaded: stand-in of this "
             "model's shape (transform mode), memory only")
_RANGE = ("key stats auto:mode=range,range_quantile=0.99 not loaded: "
          "stand-in of this model's shape (range mode), memory only")
_SAME_ON_BOTH = {
    "bf16": (None, "bfloat16", ""),
    "float32": (None, "float32", ""),
    "fp16": (None, "float16", ""),
    "baseline": (None, "float32", ""),
    "fp8_e4m3": ("1750b9ada385", "bfloat16", ""),
    "int8": ("3c876c7f6f92", "bfloat16", ""),
    "q8_0": ("879434dfaf88", "bfloat16", ""),
    "q4_0": ("b1885908b9d3", "bfloat16", ""),
    "kivi4": ("a05602e418f2", "bfloat16", ""),
    "kivi2": ("0e740d992195", "bfloat16", ""),
    "int4_g32_asym": ("5cfb5da77545", "bfloat16", ""),
    "kvq4": ("8681ec37bbad", "bfloat16", ""),
    "int3_magic": None,
}
# capacity.kinds.resolve_kind(name, model, catalog) -> (spec, dtype, note).
CAPACITY = {
    "qwen2.5-7b": {
        **_SAME_ON_BOTH,
        "tqmix425": ("4bb9cd6ac944", "bfloat16",
                     f"{_STD}, memory only; {_OVERRIDES}"),
        "tc3": ("9abac92aed0a", "bfloat16", _TRANSFORM),
        "ca3": ("f182f0eaed62", "bfloat16", _CHANNELS),
        "kq3": ("b476240ad139", "bfloat16", _RANGE),
        "tq4": ("eb026d2e2f6e", "bfloat16", f"{_STD}, memory only"),
        "tqmix325": None,  # Names layer 29 of 28.
    },
    "llama-3.1-8b": {
        **_SAME_ON_BOTH,
        "tqmix425": ("2471d38fe12a", "bfloat16",
                     f"{_STD}, memory only; {_OVERRIDES}"),
        "tc3": ("14f2d1ca5bf8", "bfloat16", _TRANSFORM),
        "ca3": ("c2b4fb02b464", "bfloat16", _CHANNELS),
        "kq3": ("72a5adb06e14", "bfloat16", _RANGE),
        "tq4": ("f1287df723f0", "bfloat16", f"{_STD}, memory only"),
        "tqmix325": ("ce144c4dce12", "bfloat16",
                     f"{_STD}, memory only; {_OVERRIDES}"),
    },
}
# sweep.points.parse_point(item, base) -> (spec, point name).
SWEEP = {
    "k8v4": ("189056a28885", "k8v4"),
    "int4_pc32_asym/int4_g32_asym:pre:hadv:r128": ("6e4cf0740edd", None),
    "int2_g32_asym_clip0.9": ("7e9fe27a2ed3", None),
    "int4_g32_asym:f32": ("36e289a5486a", None),
    "int8/int4_g32:s4": ("20c344271c9c", None),
    "int4_lm:had:rs3": ("53f188742aa9", None),
    "q8_0/q4_0": ("9a9603bbedc2", None),
    "kivi2": ("0e740d992195", None),
    "fp/int4_g32": ("a79426ed2c64", None),
    "int4_g32": ("91fb64ba36b9", None),
    "CONFIGS/formats/k8v4.py": ("189056a28885", "k8v4"),
    "int9": None,
    "int4_g32:wat": None,
    "baseline": None,
}
BASE = CacheSpec(k=parse_short_spec("int4_lm"), v=parse_short_spec("int4_lm"),
                 key_rope="pre", hadamard_k=True, hadamard_v=True,
                 rotation_seed=0, residual=32)
SWEEP_ON_BASE = {
    "int3_lm": "9ea203fb5e52",
    "int4:post:noaff": "74b2d8207873",
    "int4_lm:nohad": "e3db22c22157",
    "int2_lm:noaff:rs9": "fc80960c9ee1",
    "int4_g32_asym:hadk:r64": "de08d2584222",
    "kivi2": "0e740d992195",  # A preset: the base does not apply.
}


@pytest.mark.parametrize("name", sorted(BENCH))
def test_as_the_bench_resolved(name):
  if BENCH[name] is None:
    with pytest.raises(ValueError, match=r"^cache kind '"):
      resolve_kind(_path(name))
    return
  kind = resolve_kind(_path(name))
  assert (_digest(kind.spec), kind.dtype) == BENCH[name]
  assert kind.name == _path(name) and kind.note == ""


@pytest.mark.parametrize("model, name", [
    (model, name) for model in sorted(CAPACITY)
    for name in sorted(CAPACITY[model])])
def test_as_the_capacity_plan_resolved(model, name):
  config = ARCHITECTURES[model].config
  if CAPACITY[model][name] is None:
    with pytest.raises(ValueError, match=r"^--kinds item '"):
      resolve_kind(name, model=config, what="--kinds item")
    return
  kind = resolve_kind(name, model=config, what="--kinds item")
  assert (_digest(kind.spec), kind.dtype, kind.note) == CAPACITY[model][name]


@pytest.mark.parametrize("item", sorted(SWEEP))
def test_as_the_sweep_resolved(item):
  if SWEEP[item] is None:
    with pytest.raises(ValueError, match=r"^--points item '"):
      parse_point(_path(item), None)
    return
  digest, name = SWEEP[item]
  point = parse_point(_path(item), None)
  assert (_digest(point.spec), point.name) == (digest, name or item)
  assert _digest(resolve_kind(_path(item)).spec) == digest


@pytest.mark.parametrize("item", sorted(SWEEP_ON_BASE))
def test_as_the_sweep_resolved_on_a_base(item):
  assert _digest(parse_point(item, BASE).spec) == SWEEP_ON_BASE[item]
  assert _digest(resolve_kind(item, base=BASE).spec) == SWEEP_ON_BASE[item]


def test_dense_names_in_every_spelling():
  for names, dtype in ((("bf16", "bfloat16"), "bfloat16"),
                       (("fp16", "float16"), "float16"),
                       (("f32", "fp32", "float32"), "float32")):
    for name in names:
      assert resolve_kind(f" {name} ") == Kind(name, None, dtype)


def test_short_specs_are_kinds_everywhere():
  kind = resolve_kind("int2_pc32_asym/int4_g32:r64")
  assert kind == Kind("int2_pc32_asym/int4_g32:r64", CacheSpec(
      k=parse_short_spec("int2_pc32_asym"), v=parse_short_spec("int4_g32"),
      residual=64), "float32")
  # A short spec that names a preset's formats is that preset's cache.
  assert resolve_kind("int4_g32_asym_clip0.5").spec.k.clip_ratio == 0.5
  config = ARCHITECTURES["qwen2.5-7b"].config
  priced = resolve_kind("int4_g32_asym_clip0.5", model=config)
  assert priced.dtype == "bfloat16" and priced.note == ""
  with pytest.raises(ValueError, match=r"'int4_g48' does not fit this "
                     r"model \(num_layers=28, head_dim=128\)"):
    resolve_kind("int4_g48", model=config)


def test_unknown_name_lists_what_is_allowed():
  with pytest.raises(ValueError) as info:
    resolve_kind("int3_magic", what="--kinds item")
  message = str(info.value)
  assert message.startswith("--kinds item 'int3_magic' is unknown; allowed: "
                            "bf16, float32, ")
  for part in ("fp16", "kivi2", "q4_0", "preset file", "KSPEC[/VSPEC]",
               "cache format 'int3_magic' is not understood"):
    assert part in message
  with pytest.raises(ValueError, match=r"^cache kind 'int4_g32:wat': option "
                     "'wat' is not understood"):
    resolve_kind("int4_g32:wat")
