"""Grid expansion, invalid-combination skipping and named points."""

from __future__ import annotations

import numpy as np
import pytest

from kvq_jax.cache.key_affine import KeyAffine
from kvq_jax.cache.spec import CacheSpec
from kvq_jax.quant import QuantSpec
from kvq_jax.settings.experiment_settings import settings_from_config
from kvq_jax.settings.presets import load_preset
from kvq_jax.settings.short_specs import parse_short_spec
from kvq_jax.sweep import runner
from kvq_jax.sweep.grid import expand_grid, point_name
from kvq_jax.sweep.points import parse_points
from kvq_jax.sweep.resolve import check_points


def test_grid_expands_every_valid_combination_in_order():
  points, skipped = expand_grid(None, ["int8", "int4"], [0, 32],
                                ["sym", "asym"], [0, 64], head_dim=64,
                                num_layers=2)
  assert not skipped
  assert len(points) == 2 * 2 * 2 * 2
  first = points[0].spec
  assert first.k == first.v == QuantSpec("int8", "symmetric", "per_token")
  assert first.residual == 0 and points[1].spec.residual == 64
  assert [p.name for p in points[:4]] == [
      "int8", "int8:r64", "int8_asym", "int8_asym:r64"]
  assert points[4].name == "int8_g32"


def test_invalid_combinations_are_skipped_with_the_reason():
  points, skipped = expand_grid(None, ["fp8_e4m3", "int3", "int4"], [32, 48],
                                ["sym", "asym"], [0], head_dim=32,
                                num_layers=1)
  reasons = {s.name: s.reason for s in skipped}
  assert "fp8" in reasons["fp8_e4m3_g32_asym"]
  assert "symmetric" in reasons["fp8_e4m3_g32_asym"]
  assert "group_size=48" in reasons["int4_g48_sym"]
  names = sorted(p.name for p in points)
  assert names == ["fp8_e4m3_g32", "int3_g32", "int3_g32_asym", "int4_g32",
                   "int4_g32_asym"]
  # int3 packs 8 codes together: head_dim 36 cannot hold per-token int3.
  _, skipped = expand_grid(None, ["int3"], [0], ["sym"], [0], head_dim=36,
                           num_layers=1)
  assert "packs 8" in skipped[0].reason


def test_grid_keeps_the_base_cache_settings():
  base = CacheSpec(k=QuantSpec("int8", granularity="per_token"),
                   v=QuantSpec("int8", granularity="per_token"),
                   key_rope="pre", hadamard_v=True)
  (point,), _ = expand_grid(base, ["int4"], [32], ["sym"], [0], head_dim=64,
                            num_layers=2)
  assert point.spec.key_rope == "pre" and point.spec.hadamard_v
  assert point.spec.k.format == "int4"


@pytest.mark.parametrize("flag,value", [("formats", "int6"),
                                        ("schemes", "both")])
def test_unknown_axis_values_raise(flag, value):
  kwargs = dict(formats=["int4"], group_sizes=[32], schemes=["sym"],
                residuals=[0])
  kwargs[flag] = [value]
  with pytest.raises(ValueError, match=f"--{flag}"):
    expand_grid(None, head_dim=64, num_layers=1, **kwargs)


def test_named_points_presets_and_compact_syntax():
  points = parse_points(
      "k8v4,int4_pc32_asym/int4_g32_asym:pre:hadv:r128,int2_g32_asym_clip0.9",
      None, head_dim=64, num_layers=2)
  assert [p.source for p in points] == ["point"] * 3
  k8v4 = points[0].spec
  assert (k8v4.k.format, k8v4.v.format) == ("int8", "int4")
  kivi = points[1].spec
  assert kivi.k.granularity == "per_channel" and kivi.v.group_size == 32
  assert kivi.key_rope == "pre" and kivi.hadamard_v and not kivi.hadamard_k
  layer = kivi.layer(0)
  assert kivi.residual == 128 and (layer.flush_k, layer.flush_v) == (32, 1)
  assert points[2].spec.k.clip_ratio == 0.9
  assert point_name(points[2].spec) == "int2_g32_asym_clip0.9"


@pytest.mark.parametrize("text,match", [
    ("int4_g32:wat", "option 'wat'"),
    ("int9", "not understood"),
    ("baseline", "no quantized cache"),
    ("int4_g48", "group_size=48"),
])
def test_bad_points_raise_naming_the_item(text, match):
  with pytest.raises(ValueError, match=match):
    parse_points(text, None, head_dim=64, num_layers=1)


def test_check_points_needs_no_model():
  """What HumanEval, passkey and agreement call before the model loads."""
  settings = settings_from_config(load_preset("int4_g32"))
  check_points(settings, None)
  check_points(settings, "int8,kivi2,int4_g32_asym:r64")
  with pytest.raises(ValueError, match=r"--points item 'int9' is unknown"
                     ".*not understood"):
    check_points(settings, ["int8", "int9"])
  check_points(settings, "int4_g48")  # Only the model's head_dim waits.


def test_same_spec_is_evaluated_once_and_a_name_clash_raises(tmp_path):
  points = parse_points("int4_g32,int4_g32:post", None, head_dim=64,
                        num_layers=1)
  assert [p.name for p in runner.unique_points(points)] == ["int4_g32"]
  for sub, bits in (("a", 8), ("b", 4)):
    (tmp_path / sub).mkdir()
    (tmp_path / sub / "mine.py").write_text(
        "from configs import base\n\n\ndef get_config():\n"
        "  c = base.get_config()\n"
        f"  c.cache.k = c.cache.v = base.kv(type='int', bits={bits})\n"
        "  return c\n")
  clash = parse_points([str(tmp_path / "a" / "mine.py"),
                        str(tmp_path / "b" / "mine.py")], None, head_dim=64,
                       num_layers=1)
  with pytest.raises(ValueError, match="both named 'mine'"):
    runner.unique_points(clash)


def test_flush_option_makes_both_tensors_wait():
  point, = parse_points("int4_g32_asym:f32", None, head_dim=64, num_layers=2)
  layer = point.spec.layer(0)
  assert (layer.flush_k, layer.flush_v) == (32, 32)
  assert layer.full_precision_slots == {"k": 31, "v": 31}
  plain, = parse_points("int4_g32_asym", None, head_dim=64, num_layers=2)
  assert plain.spec.layer(0).full_precision_slots == {"k": 0, "v": 0}


def test_rotation_and_affine_options():
  affines = tuple(KeyAffine.from_arrays(np.zeros((3, 64)), np.ones((3, 64)))
                  for _ in range(2))
  base = CacheSpec(k=parse_short_spec("int4_lm"), v=parse_short_spec(
      "int4_lm"), key_rope="pre", hadamard_k=True, hadamard_v=True,
                   rotation_seed=0, key_affines=affines)
  rot, plain, bare, seeded = parse_points(
      "int3_lm,int4:post:noaff,int4_lm:nohad,int2_lm:noaff:rs9", base,
      head_dim=64, num_layers=2)
  assert rot.spec.k == parse_short_spec("int3_lm")
  assert rot.spec.key_affines == affines and rot.spec.rotation_seed == 0
  assert plain.spec.key_affines == () and plain.spec.key_rope == "post"
  assert not bare.spec.hadamard_k and bare.spec.rotation_seed is None
  assert bare.spec.key_affines == affines
  assert seeded.spec.layer(1).rotation_key == (9, 1)
  with pytest.raises(ValueError, match="key_rope='pre'"):
    parse_points("int4:post", base, head_dim=64, num_layers=2)
