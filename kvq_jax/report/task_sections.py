"""The serving and downstream-task results under a folder, as markdown
sections of `experiments.report`.

Files read (recursively, sorted by path): `serve.json`
(`experiments.serve_bench`, `serving.bench_report`): the per-kind table
and the capacity -> concurrency -> requests/s chain; `humaneval.json`
(`experiments.humaneval`, `tasks.humaneval_report`): the pass@1 table with
the paired comparisons. A file that does not parse, or lacks the keys, is
left out with a note.
"""

from __future__ import annotations

import json
import os
import pathlib

from kvq_jax.serving import bench_report
from kvq_jax.tasks import humaneval_report


def _serve(data: dict, source: str) -> str:
  rows = data["rows"]
  return (f"### Serving: `{source}`\n\n{data['machine']}; model "
          f"{data['model']}; {data['workload']}; KV budget "
          f"{data['budget_bytes'] / 2 ** 20:.2f} MiB\n\n"
          + bench_report.markdown_table(rows) + "\n\n"
          + bench_report.chain(rows))


def _humaneval(data: dict, source: str) -> str:
  return (f"### HumanEval: `{source}`\n\n"
          + humaneval_report.summary_markdown(data))


_READERS = {bench_report.SERVE_FILE: _serve,
            humaneval_report.RESULTS_FILE: _humaneval}


def collect_sections(folder: str | os.PathLike
                     ) -> tuple[list[str], list[str]]:
  """(one markdown section per results file, notes on files left out)."""
  root = pathlib.Path(folder)
  if not root.is_dir():
    return [], []
  sections, notes = [], []
  for path in sorted(p for p in root.rglob("*")
                     if p.name in _READERS and p.is_file()):
    source = path.relative_to(root).as_posix()
    try:
      data = json.loads(path.read_text(encoding="utf-8"))
      sections.append(_READERS[path.name](data, source))
    except (OSError, ValueError, KeyError, TypeError) as e:
      notes.append(f"`{source}`: skipped, {type(e).__name__}: {e}")
  return sections, notes
