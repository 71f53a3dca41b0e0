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
# bubblewrap isolates the generated programs HumanEval runs
# (kvq_jax/tasks/sandbox_isolation.py); without it they run under the
# fallback (process + rlimits + audit hook + unshare), which also works.
if ! command -v bwrap >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    { DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap \
        || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
             apt-get install -y -qq bubblewrap; }; } >/dev/null 2>&1 \
      || echo "setup: could not install bubblewrap; HumanEval programs will run under the fallback sandbox"
  else
    echo "setup: bubblewrap (bwrap) not found; for the namespaced HumanEval sandbox run as root: apt-get install bubblewrap"
  fi
fi
