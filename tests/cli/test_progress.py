"""The one-line progress bar (`cli.progress`)."""

from __future__ import annotations

import io

from kvq_jax.cli.progress import ProgressBar


def test_progress_bar():
  stream = io.StringIO()
  bar = ProgressBar("eval", stream=stream, width=10)
  bar(1, 4)
  assert "eval [##........] 1/4" in stream.getvalue()
  assert not stream.getvalue().endswith("\n")
  bar(4, 4)
  assert "[##########] 4/4" in stream.getvalue()
  assert stream.getvalue().endswith("\n")
