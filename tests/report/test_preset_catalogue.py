"""The preset catalogue (experiments.presets): every preset listed once with
its role, family, model, bits and headline, and the committed
configs/README.md equal to a regeneration."""

from __future__ import annotations

import pytest

from kvq_jax import facade
from kvq_jax.report import preset_catalogue
from kvq_jax.settings import presets

COMMAND = "python -m experiments.presets"


def _rows_of(markdown: str) -> dict[str, list[str]]:
  rows = {}
  for line in markdown.splitlines():
    cells = [c.strip() for c in line.strip("|").split("|")]
    if line.startswith("| ") and cells[0] in presets.preset_paths():
      rows[cells[0]] = cells
  return rows


def test_headlines_are_read_from_docstrings():
  assert preset_catalogue.headline(
      "Measured: dPPL +3.99 [+3.55, +4.45] against baseline") == \
      "+3.99 [+3.55, +4.45]"
  assert preset_catalogue.headline("ΔPPL −0.016 [−0.063,\n +0.031]") == \
      "−0.016 [−0.063, +0.031]"
  assert preset_catalogue.headline("no number here") == ""


@pytest.mark.slow
def test_the_committed_catalogue_is_its_regeneration():
  smollm2 = facade.model_config("smollm2-135m")
  rows = preset_catalogue.catalogue(
      lambda name: smollm2 if name == "smollm2-135m" else None)
  assert sorted(r.name for r in rows) == presets.available_presets()
  by_name = {r.name: r for r in rows}
  assert by_name["int4_g32"].bits_512 == 4.5  # By hand: 4 + 16/32.
  assert by_name["kivi2"].bits_4096 < by_name["kivi2"].bits_512
  assert by_name["tqmix250"].superseded_by == "cvmix250"
  assert by_name["qwen_cvmix250"].model == "qwen2.5-coder-0.5b"
  fresh = _rows_of(preset_catalogue.markdown(rows, COMMAND))
  committed = _rows_of((presets.CONFIG_DIR / "README.md").read_text())
  assert sorted(committed) == sorted(fresh)
  for name, cells in fresh.items():
    if by_name[name].model in ("any", "smollm2-135m"):
      assert committed[name] == cells, name
    else:  # Priced on Qwen / Gemma, which this test does not fetch.
      assert committed[name][:3] + committed[name][5:] == \
          cells[:3] + cells[5:], name
