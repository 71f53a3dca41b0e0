"""parse_short_spec / short_name / parse_layer_overrides."""

from __future__ import annotations

import pytest

from kvq_jax.quant import QuantSpec, ggml_spec
from kvq_jax.settings.short_specs import (parse_layer_overrides,
                                          parse_short_spec, short_name)

NAMES = ["fp", "int8", "int4_g32", "int4_g32_asym", "int2_pc32_asym",
         "fp8_e4m3", "fp8_e5m2", "int3_g16", "int4_clip0.9",
         "int4_g32_asym_clip0.85", "int8_pc64", "int5_g32", "int5_g16_asym",
         "int8_g32_narrow", "int4_pc32_narrow_clip0.9", "q8_0", "q4_0",
         "q4_1", "q5_0", "q5_1", "int4_g64_ggml", "int3_g16_asym_ggml",
         "int8_narrow_ggml", "int4_lm", "int2_g32_lm", "int3_lm",
         "int4_st", "int3_st_o1", "int4_g32_asym_o2", "int4_lm_o1",
         "int2_vq", "int4_vq", "int2_g32_vq", "int1_vq", "int1_g32_vq",
         "int2_vq_se4m3", "int3_lm_se5m2", "int1_g32_vq_se4m3"]


@pytest.mark.parametrize("name", NAMES)
def test_round_trip(name):
  assert short_name(parse_short_spec(name)) == name


def test_parsed_fields():
  assert parse_short_spec("fp") is None
  assert parse_short_spec(" int8 ") == QuantSpec(
      format="int8", scheme="symmetric", granularity="per_token")
  assert parse_short_spec("int4_g32") == QuantSpec(
      format="int4", granularity="per_group", group_size=32)
  assert parse_short_spec("int4_g32_asym").scheme == "asymmetric"
  assert parse_short_spec("int3_lm") == QuantSpec(
      format="int3", scheme="lloyd_max", granularity="per_token")
  kivi = parse_short_spec("int2_pc32_asym")
  assert (kivi.format, kivi.granularity, kivi.group_size, kivi.scheme) == (
      "int2", "per_channel", 32, "asymmetric")
  fp8 = parse_short_spec("fp8_e4m3")
  assert (fp8.format, fp8.granularity, fp8.group_size) == (
      "fp8_e4m3", "per_token", None)
  assert parse_short_spec("int4_g32_clip0.9").clip_ratio == 0.9
  assert parse_short_spec("int4_g32").scale_dtype == "bfloat16"
  assert parse_short_spec("int4_g32").rounding == "kvq"
  assert parse_short_spec("int8_g32_narrow").scheme == "symmetric_narrow"
  assert parse_short_spec("int5_g32").format == "int5"
  assert parse_short_spec("int3_st_o2") == QuantSpec(
      format="int3", scheme="static", granularity="per_token", outliers=2)


@pytest.mark.parametrize("name, fmt, scheme", [
    ("q8_0", "int8", "symmetric_narrow"), ("q4_0", "int4", "symmetric"),
    ("q4_1", "int4", "asymmetric"), ("q5_0", "int5", "symmetric"),
    ("q5_1", "int5", "asymmetric")])
def test_llama_cpp_names(name, fmt, scheme):
  spec = parse_short_spec(name)
  assert spec == ggml_spec(name) == QuantSpec(
      format=fmt, scheme=scheme, granularity="per_group", group_size=32,
      scale_dtype="float16", rounding="ggml")
  # The long spelling parses to the same spec; short_name prefers the name.
  long_name = {"symmetric": "", "symmetric_narrow": "_narrow",
               "asymmetric": "_asym"}[scheme]
  long_name = f"{fmt}_g32{long_name}_ggml"
  assert parse_short_spec(long_name) == spec
  assert short_name(parse_short_spec(long_name)) == name


def test_ggml_suffix_sets_float16_scales():
  spec = parse_short_spec("int4_g64_ggml")
  assert (spec.rounding, spec.scale_dtype, spec.group_size) == (
      "ggml", "float16", 64)


@pytest.mark.parametrize("bad", [
    "", "int6", "int4_g", "int4_gx", "fp16", "INT8", "int4_g32_sym",
    "int4_clip", "int4_clip0.9.1", "int4_asym_g32", "int8 int4",
    "int4_g32_ggml_asym", "int4_asym_narrow", "q4_k", "Q4_0", "q4_0_g32"])
def test_grammar_errors_name_the_text(bad):
  with pytest.raises(ValueError, match="not understood; allowed: 'fp' or"):
    parse_short_spec(bad)


@pytest.mark.parametrize("bad, why", [
    ("int4_clip1.5", "clip_ratio"),        # clip must be in (0, 1].
    ("int4_g0", "group_size"),             # per_group needs >= 1.
    ("int4_pc1", "group_size"),            # per_channel needs >= 2.
    ("fp8_e4m3_asym", "symmetric"),        # fp8 is symmetric only.
    ("fp8_e4m3_narrow", "symmetric"),      # ... and has no narrow rule.
    ("fp8_e4m3_ggml", "rounding='ggml'"),  # ggml rounds integer codes.
    ("int4_g32_ggml_clip0.9", "clip_ratio=1.0"),  # ggml does not clip.
])
def test_invalid_specs_name_the_text_and_field(bad, why):
  with pytest.raises(ValueError, match=f"cache format '{bad}'.*{why}"):
    parse_short_spec(bad)


def test_layer_overrides():
  overrides = parse_layer_overrides("0,29:fp/fp; 5:int8/int4_g32;")
  assert overrides == (
      (0, None, None), (29, None, None),
      (5, parse_short_spec("int8"), parse_short_spec("int4_g32")))
  assert parse_layer_overrides("") == ()
  assert parse_layer_overrides(" 3 :fp/int2_pc32_asym")[0][0] == 3


@pytest.mark.parametrize("bad, match", [
    ("0:fp", "expected 'LAYER"),
    ("0 fp/fp", "expected 'LAYER"),
    ("x:fp/fp", "layer 'x' is not a non-negative integer"),
    ("-1:fp/fp", "layer '-1' is not a non-negative integer"),
    ("0,:fp/fp", "layer '' is not"),
    ("0:int9/fp", "not understood"),
])
def test_layer_override_errors(bad, match):
  with pytest.raises(ValueError, match=match):
    parse_layer_overrides(bad)


def test_int1_exists_for_vector_codes_only():
  assert parse_short_spec("int1_vq") == QuantSpec(
      format="int1", scheme="vector", granularity="per_token")
  for name in ("int1", "int1_asym", "int1_lm", "int1_st"):
    with pytest.raises(ValueError, match="int1"):
      parse_short_spec(name)


def test_eight_bit_scales():
  """`_se4m3` / `_se5m2`: the scale dtype, codebook schemes only."""
  assert parse_short_spec("int2_vq_se4m3") == QuantSpec(
      format="int2", scheme="vector", granularity="per_token",
      scale_dtype="float8_e4m3fn")
  assert parse_short_spec("int3_lm_se5m2").scale_dtype == "float8_e5m2"
  for text, match in (("int4_se4m3", "scheme='symmetric'"),
                      ("int4_g32_asym_se5m2", "scheme='asymmetric'"),
                      ("int2_vq_se4m3_o1", "outliers=1"),
                      ("int4_lm_se4m3_ggml", "not both")):
    with pytest.raises(ValueError, match=match):
      parse_short_spec(text)
