#!/usr/bin/env bash
# Creates ./.venv (once) and installs kvq_jax with its test extras from this
# repository's own pyproject.toml. Safe to run again: it only re-installs.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
# setuptools' "Editable installation." notice is information, not a problem,
# yet pip prints it even with --quiet: hide that one warning only.
PYTHONWARNINGS="ignore:Editable installation" \
  .venv/bin/python -m pip install --quiet -e '.[dev]'
