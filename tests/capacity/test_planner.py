"""serving.capacity_plan (and capacity.architectures, capacity.kinds through
settings.kinds, experiments.capacity): the numbers checked by hand, bad
input refused before any cache is traced."""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from kvq_jax import assets
from kvq_jax.cache.key_affine import KeyAffine
from kvq_jax.capacity import memory
from kvq_jax.capacity.architectures import (ARCHITECTURES,
                                            get_architecture)
from kvq_jax.serving import capacity_plan as planner
from kvq_jax.serving.capacity_plan import DEFAULT_KINDS, CapacityRequest
from kvq_jax.settings import kinds
from kvq_jax.settings.experiment_settings import settings_from_config

GIB = 2**30
_ROOT = pathlib.Path(__file__).resolve().parents[2]
# Llama-3.1-8B: 32 layers x 8 kv heads x head_dim 128, K and V, 2 bytes.
BF16_8B_PER_TOKEN = 2 * 32 * 8 * 128 * 2
WEIGHTS_8B_BF16 = 8_030_261_248 * 2  # 16.06e9 B.
BUDGET_8B_24GIB = 24 * GIB - WEIGHTS_8B_BF16


def plan_capacity(request: CapacityRequest) -> planner.CapacityPlan:
  return planner.plan_capacity(request)


def resolve_kind(name: str, config):
  """A kind priced on `config`, as the plan resolves it."""
  return kinds.resolve_kind(name, model=config, what="--kinds item")


def _request(**changes) -> CapacityRequest:
  fields = dict(model="llama-3.1-8b", device_memory_gib=24,
                weight_bytes_per_param=2, context=8192, concurrency=1,
                kinds=("bf16",))
  fields.update(changes)
  return CapacityRequest(**fields)


@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_architecture_params_match_the_model_card(name):
  arch = get_architecture(name)
  assert memory.num_params(arch.config) == pytest.approx(
      arch.params_published, rel=3e-3)


def test_architecture_kv_shapes():
  shapes = {n: (a.config.num_layers, a.config.num_kv_heads,
                a.config.head_dim) for n, a in ARCHITECTURES.items()}
  assert shapes == {"llama-3.1-8b": (32, 8, 128),
                    "llama-3.1-70b": (80, 8, 128),
                    "qwen2.5-7b": (28, 4, 128)}
  assert ARCHITECTURES["llama-3.1-8b"].config.vocab_size == 128256
  assert ARCHITECTURES["llama-3.1-8b"].config.max_position_embeddings == \
      131072


def test_bf16_llama_8b_on_24_gib_by_hand():
  plan = plan_capacity(_request())
  assert BUDGET_8B_24GIB == 9_709_281_280
  assert plan.weight_bytes == WEIGHTS_8B_BF16
  assert plan.kv_budget_bytes == BUDGET_8B_24GIB
  (row,) = plan.rows
  assert BF16_8B_PER_TOKEN == 131072
  assert row.kv_bytes_per_token == BF16_8B_PER_TOKEN
  assert row.kv_bytes_per_sequence == 8192 * BF16_8B_PER_TOKEN  # 1 GiB.
  assert row.effective_bits == 16.0 and row.vs_bf16 == 1.0
  assert row.max_concurrency == 9  # 9.04 GiB / 1 GiB per request.
  assert row.max_context == BUDGET_8B_24GIB // BF16_8B_PER_TOKEN == 74075


def test_concurrency_splits_the_budget():
  (row,) = plan_capacity(_request(concurrency=4)).rows
  assert row.max_context == (BUDGET_8B_24GIB // 4) // BF16_8B_PER_TOKEN


def test_overhead_comes_off_the_budget():
  plan = plan_capacity(_request(overhead_gib=1.5))
  assert plan.kv_budget_bytes == BUDGET_8B_24GIB - int(1.5 * GIB)
  assert plan.notes[0].startswith("overhead 1.5 GiB")


def test_70b_fp8_weights_fp8_vs_bf16_cache_by_hand():
  # 80 GiB, 1 B/param weights (70.55e9 B): 14.29 GiB left for the cache.
  plan = plan_capacity(CapacityRequest(
      model="llama-3.1-70b", device_memory_gib=80, weight_bytes_per_param=1,
      context=3800, kinds=("bf16", "fp8_e4m3")))
  budget = 80 * GIB - 70_553_706_496
  assert plan.kv_budget_bytes == budget
  bf16, fp8 = plan.rows
  assert bf16.kv_bytes_per_token == 2 * 80 * 8 * 128 * 2  # 327680.
  # fp8: one byte per element plus a bf16 scale per (token, head).
  assert fp8.kv_bytes_per_token == 2 * 80 * 8 * (128 + 2)  # 166400.
  assert fp8.effective_bits == 8.125
  assert bf16.max_concurrency == budget // (3800 * 327680) == 12
  assert fp8.max_concurrency == budget // (3800 * 166400) == 24


def test_residual_window_is_charged_per_request():
  # kivi2 keeps up to 128 + 31 (K) and 128 (V) tokens in bf16: at a short
  # context that costs more than the packed bits say.
  (row,) = plan_capacity(_request(kinds=("kivi2",), context=512)).rows
  assert row.stored_bits == 3.0
  assert row.effective_bits > 5.0
  assert row.kv_fixed_bytes_per_sequence > 0
  assert row.max_concurrency == BUDGET_8B_24GIB // row.kv_bytes_per_sequence


def test_default_kinds_plan_on_qwen():
  plan = plan_capacity(CapacityRequest(model="qwen2.5-7b",
                                       device_memory_gib=24))
  assert [r.kind for r in plan.rows] == list(DEFAULT_KINDS)
  bits = {r.kind: r.effective_bits for r in plan.rows}
  assert bits["bf16"] == 16.0 and bits["q4_0"] == 4.5
  # More bits, fewer requests (kivi's window costs it at 8k as well).
  order = sorted(plan.rows, key=lambda r: r.kv_bytes_per_sequence)
  assert [r.max_concurrency for r in order] == sorted(
      (r.max_concurrency for r in order), reverse=True)
  (tq,) = [r for r in plan.rows if r.kind == "tqmix425"]
  assert "stand-in of this model's shape" in tq.note


def test_stand_in_key_stats_have_the_models_shape():
  config = ARCHITECTURES["qwen2.5-7b"].config
  kind = resolve_kind("tqmix425", config)
  assert len(kind.spec.key_affines) == config.num_layers
  assert kind.spec.key_affines[0].shape == (4, 128)
  assert kind.dtype == "bfloat16"


def test_transform_stand_in_charges_the_basis_and_codebooks():
  """A transform-coding recipe (tc3) is stood in for in transform mode:
  the keys get a spread of widths (their codebooks charged) and the int8
  basis: at 512 tokens on Qwen2.5-7B's shape (4 kv heads, head_dim 128)
  K H^2 int8 + K H float32 row scales per layer, 65536 + 2048 bytes, over
  2 K H 512 elements: 1.03 bits."""
  config = ARCHITECTURES["qwen2.5-7b"].config
  kind = resolve_kind("tc3", config)
  assert "transform mode, rotated" in kind.note
  widths = kind.spec.layer(0).k.component_bits
  assert sum(widths) == 3 * 128 and len(set(widths)) > 3
  rows = {r.kind: r for r in plan_capacity(CapacityRequest(
      model="qwen2.5-7b", device_memory_gib=24, kinds=("tc3", "kq3"),
      context=512)).rows}
  # tc3 stores less per token than kq3 (no outlier) but pays the basis.
  assert rows["tc3"].stored_bits < rows["kq3"].stored_bits
  assert (rows["tc3"].effective_bits - rows["tc3"].stored_bits
          > rows["kq3"].effective_bits - rows["kq3"].stored_bits + 1.03)


def test_channel_widths_recipe_is_stood_in_without_a_basis():
  """ca3 ('auto:mode=transform', no rotation): the same spread of widths
  as tc3, and exactly the 1.03 bits of tc3's basis less in constants."""
  config = ARCHITECTURES["qwen2.5-7b"].config
  kind = resolve_kind("ca3", config)
  assert "transform mode)" in kind.note and "rotated" not in kind.note
  assert kind.spec.layer(0).key_affine.rotation == ()
  assert sum(kind.spec.layer(0).k.component_bits) == 3 * 128
  rows = {r.kind: r for r in plan_capacity(CapacityRequest(
      model="qwen2.5-7b", device_memory_gib=24, kinds=("tc3", "ca3"),
      context=512)).rows}
  assert rows["ca3"].stored_bits == rows["tc3"].stored_bits
  basis_bits = 8 * (65536 + 2048) / (2 * 4 * 128 * 512)  # 1.03125
  assert rows["tc3"].effective_bits - rows["ca3"].effective_bits == (
      pytest.approx(basis_bits, abs=1e-9))


@pytest.mark.parametrize("changes, match", [
    (dict(device_memory_gib=0), "device_memory_gib=0"),
    (dict(device_memory_gib=-8.0), "device_memory_gib"),
    (dict(device_memory_gib=math.nan), "finite number > 0"),
    (dict(weight_bytes_per_param=0), "weight_bytes_per_param"),
    (dict(context=0), "context=0: allowed: an integer >= 1"),
    (dict(concurrency=-1), "concurrency"),
    (dict(concurrency=2.5), "concurrency"),
    (dict(overhead_gib=-1), "overhead_gib=-1: allowed: a finite number >= 0"),
    (dict(kinds=()), "kinds"),
    (dict(kinds=("bf16", "bf16")), "distinct"),
])
def test_bad_numbers(changes, match):
  with pytest.raises(ValueError, match=match):
    _request(**changes)


@pytest.fixture
def no_tracing(monkeypatch):
  """Fails the test if a cache would be traced (bad input must not get
  that far)."""
  def boom(*args, **kwargs):
    raise AssertionError("a cache was traced")
  monkeypatch.setattr(memory, "effective_bytes", boom)
  monkeypatch.setattr(memory, "_costs", boom)


def test_unknown_model_lists_what_is_allowed(no_tracing):
  with pytest.raises(ValueError, match=r"llama-3\.1-70b.*smollm2-135m"):
    plan_capacity(_request(model="llama-9-1t"))


def test_unknown_kind_lists_what_is_allowed(no_tracing):
  with pytest.raises(ValueError, match=r"'int3_magic' is unknown; allowed: "
                     r"bf16, float32, .*q4_0"):
    plan_capacity(_request(kinds=("bf16", "int3_magic")))


def test_weights_larger_than_device(no_tracing):
  # 70.55e9 params in bf16 are 131.4 GiB: no 80 GiB card holds them.
  with pytest.raises(ValueError, match=r"131\.42 GiB.*no memory for the KV"):
    plan_capacity(_request(model="llama-3.1-70b", device_memory_gib=80))
  with pytest.raises(ValueError, match="overhead_gib=10"):
    plan_capacity(_request(overhead_gib=10))


def test_kind_that_does_not_fit_the_model(no_tracing):
  # tqmix325's per-layer formats name layer 29; Qwen2.5-7B has 28 layers.
  with pytest.raises(ValueError, match=r"'tqmix325' does not fit.*0\.\.27"):
    plan_capacity(CapacityRequest(model="qwen2.5-7b", device_memory_gib=24,
                                  kinds=("tqmix325",)))


def _cli(*args):
  return subprocess.run(
      [sys.executable, "-m", "experiments.capacity", *args], cwd=_ROOT,
      capture_output=True, text=True, check=False, timeout=120)


def test_cli_table_and_json(tmp_path):
  out = tmp_path / "plan.json"
  result = _cli("--model=llama-3.1-8b", "--device_memory_gib=24",
                "--weight_bytes_per_param=2", "--context=8192",
                "--concurrency=4", "--kinds=bf16,int8", f"--out={out}")
  assert result.returncode == 0, result.stderr
  assert "KV budget 9.04 GiB (9709281280 B)" in result.stdout
  assert ("| bf16 | 16.000 | 131,072 | 1,024.0 | 1.00 | 9 | 18,518 |"
          in result.stdout)
  data = json.loads(out.read_text())
  assert data["kv_budget_bytes"] == BUDGET_8B_24GIB
  assert data["request"]["kinds"] == ["bf16", "int8"]
  rows = {r["kind"]: r for r in data["rows"]}
  assert rows["bf16"]["max_concurrency"] == 9
  assert rows["int8"]["kv_bytes_per_token"] == 2 * 32 * 8 * (128 + 2)
  assert rows["int8"]["max_context"] > rows["bf16"]["max_context"]


def test_cli_bad_kind_fails_with_the_allowed_list():
  result = _cli("--model=llama-3.1-8b", "--device_memory_gib=24",
                "--kinds=bf16,nope")
  assert result.returncode != 0
  assert "error: --kinds item 'nope' is unknown; allowed: bf16" in \
      result.stderr


def test_plan_json_round_trips():
  plan = plan_capacity(_request(kinds=("bf16", "q4_0")))
  data = json.loads(json.dumps(plan.to_json()))
  assert [r["kind"] for r in data["rows"]] == ["bf16", "q4_0"]
  assert data["max_position_embeddings"] == 131072
  assert planner.format_plan(plan).count("\n| ") == 3  # Header + 2 rows.


@pytest.mark.skipif(not assets.is_fetched("smollm2-135m"),
                    reason="smollm2-135m's file is not in the asset cache")
def test_registered_model_reads_its_config_from_the_file():
  plan = plan_capacity(_request(model="smollm2-135m", device_memory_gib=1))
  (row,) = plan.rows
  assert (plan.num_layers, plan.num_kv_heads, plan.head_dim) == (30, 3, 64)
  assert plan.num_params == 134_515_008
  assert row.kv_bytes_per_token == 2 * 30 * 3 * 64 * 2
  assert plan.source.startswith("registered model smollm2-135m")



@pytest.fixture
def key_stats_of(monkeypatch):
  """key_stats_of(layers, heads, head_dim): from then on, presets' key stats
  load (in `settings.kinds`) as `layers` affines of shape [heads,
  head_dim] (another model's, or this one's), not from disk."""
  def patch(layers: int, heads: int, head_dim: int):
    monkeypatch.setattr(kinds, "settings_from_config",
                        _settings_with_key_stats(layers, heads, head_dim))
  return patch


def _settings_with_key_stats(layers: int, heads: int, head_dim: int):
  def settings(preset):
    preset = copy.deepcopy(preset)
    stats, preset.cache.key_stats = preset.cache.key_stats, ""
    result = settings_from_config(preset)
    if not stats:
      return result
    affine = KeyAffine.from_arrays(np.zeros((heads, head_dim)),
                                   np.ones((heads, head_dim)))
    return dataclasses.replace(result, cache_spec=dataclasses.replace(
        result.cache_spec, key_affines=(affine,) * layers))
  return settings


def test_key_stats_of_another_model_are_stood_in(key_stats_of):
  config = ARCHITECTURES["llama-3.1-8b"].config
  key_stats_of(30, 3, 64)
  kind = resolve_kind("tq4", config)
  assert [a.shape for a in kind.spec.key_affines] == [(8, 128)] * 32
  assert kind.note == ("key stats auto calibrated "
                       "for 30 layers of shape (3, 64): stand-in of this "
                       "model's shape (std mode), memory only")


def test_key_stats_of_this_model_are_used(key_stats_of):
  config = ARCHITECTURES["llama-3.1-8b"].config
  key_stats_of(32, 8, 128)
  kind = resolve_kind("tq4", config)
  assert kind.note == "key stats from auto"
