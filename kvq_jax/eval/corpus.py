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


# More U+FFFD than this fraction of the decoded characters: not UTF-8 text
# (a binary file, or another encoding), refused rather than evaluated on.
MAX_REPLACEMENT_FRACTION = 0.001


def read_eval_file(path: str | os.PathLike) -> str:
  """The text of the file `path`, checked without any model.

  Raises ValueError naming the file when it is missing, not a file, empty
  (whitespace only) or not UTF-8 text: more than MAX_REPLACEMENT_FRACTION
  of its characters undecodable (each becomes U+FFFD). Called by
  `load_eval_text` and, as the flag is parsed, by `--eval_data`'s validator
  (`kvq_jax.cli.data_flags`), so a bad file fails before a model loads.
  """
  file = pathlib.Path(path).expanduser()
  if not file.exists():
    raise ValueError(f"eval_data={str(path)!r}: no such file.")
  if not file.is_file():
    raise ValueError(f"eval_data={str(path)!r}: not a file; allowed: a "
                     "UTF-8 text file.")
  text = file.read_text(encoding="utf-8", errors="replace")
  if not text.strip():
    raise ValueError(f"eval_data={str(path)!r}: the file is empty.")
  replaced = text.count("\ufffd")
  if replaced > MAX_REPLACEMENT_FRACTION * len(text):
    raise ValueError(
        f"eval_data={str(path)!r}: {replaced} of its {len(text)} characters "
        f"are not UTF-8 (decoded as U+FFFD; at most "
        f"{MAX_REPLACEMENT_FRACTION:.1%} are accepted); allowed: UTF-8 text, "
        "not a binary file (another encoding converts with `iconv -t "
        "UTF-8`).")
  return text


def load_eval_text(path: str | os.PathLike | None) -> tuple[str, str]:
  """Reads `path` (UTF-8), or the default corpus when path is None or ''.

  Returns (text, description). Raises ValueError for a missing, empty or
  non-UTF-8 file (`read_eval_file`).
  """
  if not path:
    return default_corpus()
  return read_eval_file(path), str(pathlib.Path(path).expanduser())
