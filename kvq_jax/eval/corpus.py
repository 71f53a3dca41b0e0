"""Evaluation text: a user's file, or a fixed selection of stdlib sources.

With no `--eval_data`, kvq_jax evaluates on real text that exists on every
machine with Python: the source files below, read from the running
interpreter's standard library (`sysconfig.get_paths()['stdlib']`) and joined
in this order, each preceded by a `# file: NAME` line. They are long-lived,
prose-heavy modules (docstrings and comments) present in CPython 3.8-3.13.
Their exact text differs a little between Python versions, so a number measured
on the default corpus is comparable only on the same Python version; the run's
`metrics.json` records which version (`eval_data`). For published numbers use
WikiText-2 (`--eval_data=.../wiki.test.raw`).
"""

from __future__ import annotations

import os
import pathlib
import platform
import sysconfig

DEFAULT_STDLIB_FILES = (
    "textwrap.py",
    "heapq.py",
    "difflib.py",
    "argparse.py",
    "functools.py",
    "fractions.py",
    "calendar.py",
    "string.py",
    "bisect.py",
    "contextlib.py",
)


def default_corpus() -> tuple[str, str]:
  """Returns (text, description) of the stdlib-source default corpus."""
  root = pathlib.Path(sysconfig.get_paths()["stdlib"])
  parts = []
  for name in DEFAULT_STDLIB_FILES:
    path = root / name
    if not path.is_file():
      raise ValueError(
          f"default evaluation corpus: {path} is missing from this Python "
          f"installation; pass --eval_data=FILE with a text file instead.")
    parts.append(f"# file: {name}\n" + path.read_text(encoding="utf-8"))
  description = (f"python{platform.python_version()}-stdlib:"
                 + ",".join(DEFAULT_STDLIB_FILES))
  return "\n".join(parts), description


def load_eval_text(path: str | os.PathLike | None) -> tuple[str, str]:
  """Reads `path` (UTF-8), or the default corpus when path is None or ''.

  Returns (text, description). Raises ValueError for a missing or empty file.
  """
  if not path:
    return default_corpus()
  file = pathlib.Path(path).expanduser()
  if not file.is_file():
    raise ValueError(f"eval_data={str(path)!r}: no such file.")
  text = file.read_text(encoding="utf-8", errors="replace")
  if not text.strip():
    raise ValueError(f"eval_data={str(path)!r}: the file is empty.")
  return text, str(file)
