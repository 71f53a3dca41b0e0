"""The package layout WORKSPACE.md draws: which package may import which.

Every `kvq_jax/<package>/` sits in one layer and imports only packages of
lower layers. The one exception is the core layer, whose three packages
import each other (the decoder builds its caches, the caches turn keys with
the decoder's RoPE, the loaders build model configs). A new upward import
fails here, naming the file and the import.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

import kvq_jax

ROOT = pathlib.Path(kvq_jax.__file__).parent

# Bottom to top; the same table as WORKSPACE.md's "Layout".
LAYERS = (
    ("quant", "eval"),
    ("kernels",),
    ("cache", "models", "loaders"),
    ("assets", "capacity"),
    ("facade", "persist"),
    ("settings", "sharding"),
    ("cli", "bench"),
    ("calibration", "sweep", "generation", "serving"),
    ("research", "tasks"),
    ("report",),
    ("run", "longctx"),
)
MUTUAL = frozenset({"cache", "models", "loaders"})
LAYER = {name: i for i, names in enumerate(LAYERS) for name in names}


def _package(path: pathlib.Path) -> str:
  part = path.relative_to(ROOT).parts[0]
  return part.removesuffix(".py")


def _imported(node: ast.AST) -> list[str]:
  """Top-level kvq_jax packages an import statement names."""
  if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
    parts = node.module.split(".")
    if parts[0] != "kvq_jax":
      return []
    if len(parts) > 1:
      return [parts[1]]
    return [alias.name for alias in node.names]
  if isinstance(node, ast.Import):
    return [a.name.split(".")[1] for a in node.names
            if a.name.startswith("kvq_jax.")]
  return []


def _imports() -> list[tuple[str, str, str]]:
  """(file, importing package, imported package) for every kvq_jax import."""
  out = []
  for path in sorted(ROOT.rglob("*.py")):
    if path.parent == ROOT and path.name == "__init__.py":
      continue  # The root's lazy facade re-exports.
    source = _package(path)
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
      for target in _imported(node):
        if target != source:
          out.append((str(path.relative_to(ROOT.parent)), source, target))
  return out


def _allowed(source: str, target: str) -> bool:
  if source in MUTUAL and target in MUTUAL:
    return True
  return LAYER[target] < LAYER[source]


def test_every_package_has_a_layer():
  packages = {_package(p) for p in ROOT.iterdir()
              if p.name != "__init__.py" and not p.name.startswith("_")
              and (p.suffix == ".py" or (p / "__init__.py").is_file())}
  assert packages == set(LAYER)


def test_no_package_imports_one_above_it():
  upward = [f"{path}: {source} (layer {LAYER[source]}) imports {target} "
            f"(layer {LAYER[target]})"
            for path, source, target in _imports()
            if not _allowed(source, target)]
  assert not upward, "\n".join(upward)


def test_no_experiment_package_beside_the_experiments_scripts():
  assert not (ROOT / "experiment").exists()


@pytest.mark.parametrize("source, target, allowed", [
    ("run", "report", True), ("report", "run", False),
    ("cache", "models", True), ("models", "cache", True),
    ("cli", "bench", False), ("quant", "eval", False)])
def test_allowed_follows_the_layers(source, target, allowed):
  assert _allowed(source, target) is allowed
