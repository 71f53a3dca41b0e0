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
.venv/bin/python -m pip install --quiet -e '.[dev]'
