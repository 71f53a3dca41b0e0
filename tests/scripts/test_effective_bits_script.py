"""scripts/effective_bits.py: its table is memory.effective_bits per point."""

from __future__ import annotations

import importlib.util
import pathlib

import jax.numpy as jnp
import pytest

from kvq_jax.capacity import memory
from kvq_jax.loaders import load_config
from kvq_jax.sweep.points import parse_points
from tests.fixtures.tiny_hf_model import write_tiny_model

_SCRIPT = (pathlib.Path(__file__).resolve().parents[2] / "scripts"
           / "effective_bits.py")


def _module():
  spec = importlib.util.spec_from_file_location("effective_bits", _SCRIPT)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_table_rows_are_memory_effective_bits(tmp_path):
  write_tiny_model(tmp_path)
  text = _module().table(str(tmp_path), "int8,int4_g32_asym", [16, 256],
                         "bfloat16")
  lines = text.splitlines()
  assert lines[0] == "| point | stored | @16 | @256 |"
  rows = {line.split(" | ")[0].lstrip("| "): line for line in lines[2:]}
  assert set(rows) == {"int8", "int4_g32_asym"}
  # int4, g32 asymmetric, bf16 scale and zero: 4 + 32 / 32 = 5 bits, no
  # full-precision tokens, so 5.00 at every context.
  assert rows["int4_g32_asym"] == "| int4_g32_asym | 5.00 | 5.00 | 5.00 |"
  cfg = load_config(tmp_path)
  (point,) = parse_points("int8", None, head_dim=cfg.head_dim,
                          num_layers=cfg.num_layers)
  bits = memory.effective_bits(cfg, point.spec, jnp.bfloat16, 256)
  assert rows["int8"].endswith(f"| {bits:.2f} |")
  assert bits == pytest.approx(8 + 16 / cfg.head_dim)  # One bf16 scale/row.
