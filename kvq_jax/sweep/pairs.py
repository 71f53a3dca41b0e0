"""Paired differences between two points of one sweep (same windows, same
scored tokens, same baseline pass).

Each point's per-window sums of nll_quant - nll_base are kept (the sweep's
`per_window.npz`); the difference of two points, window by window, is a
`eval.paired.cluster_mean` over windows, so the spread both share (the
windows' own difficulty) cancels, which an unpaired comparison of their two
confidence intervals cannot do.

A pair 'A:B' reports mean(ΔNLL_A - ΔNLL_B) in nats per scored token, its
window-clustered standard error, z, the 95% interval, and the verdict:
"A lower" / "B lower" when |z| >= 1.96, otherwise "no measurable change";
and the same paired difference of the KL to the baseline (`kl_diff`,
`kl_diff_stderr`, `kl_z`) when the per-window KL sums were kept.
"""

from __future__ import annotations

import math
import os
from typing import Mapping, Sequence

import numpy as np

from kvq_jax.eval.paired import Z_95, cluster_mean

_PREFIX = "delta_nll_sums:"
_KL_PREFIX = "kl_sums:"


def parse_pairs(text: str | Sequence[str] | None) -> tuple[tuple[str, str],
                                                           ...]:
  """'a:b,c:d' (or a list of 'a:b') -> (('a', 'b'), ('c', 'd'))."""
  if not text:
    return ()
  items = text.split(",") if isinstance(text, str) else list(text)
  pairs = []
  for item in filter(None, (i.strip() for i in items)):
    a, sep, b = item.partition(":")
    if not sep or not a or not b or ":" in b:
      raise ValueError(f"sweep pair {item!r}: allowed: 'POINT_A:POINT_B' "
                       "(two point names of this sweep).")
    pairs.append((a, b))
  return tuple(pairs)


def save_window_sums(path: str | os.PathLike, sums: Mapping[str, np.ndarray],
                     tokens_per_window: int,
                     kl_sums: Mapping[str, np.ndarray] | None = None) -> None:
  """Writes {point: per-window ΔNLL sums} (and KL sums, `kl_sums:NAME`) and
  the tokens per window."""
  np.savez(path, tokens_per_window=np.asarray(tokens_per_window),
           **{_PREFIX + name: np.asarray(v, np.float64)
              for name, v in sums.items()},
           **{_KL_PREFIX + name: np.asarray(v, np.float64)
              for name, v in (kl_sums or {}).items()})


def _load_prefixed(path: str | os.PathLike, prefix: str) -> tuple[dict, int]:
  with np.load(path) as f:
    return ({k[len(prefix):]: f[k] for k in f.files if k.startswith(prefix)},
            int(f["tokens_per_window"]))


def load_window_sums(path: str | os.PathLike) -> tuple[dict, int]:
  return _load_prefixed(path, _PREFIX)


def load_kl_sums(path: str | os.PathLike) -> dict:
  """{point: per-window KL sums}; {} for a sweep written before they were
  kept."""
  return _load_prefixed(path, _KL_PREFIX)[0]


def pair_row(sums: Mapping[str, np.ndarray], tokens_per_window: int,
             a: str, b: str,
             kl_sums: Mapping[str, np.ndarray] | None = None) -> dict:
  """The paired difference A - B (module docstring) as a CSV row."""
  missing = [n for n in (a, b) if n not in sums]
  if missing:
    raise ValueError(f"sweep pair {a}:{b}: no point named "
                     f"{', '.join(map(repr, missing))}; allowed: "
                     f"{', '.join(sorted(sums))}.")
  diff = np.asarray(sums[a], np.float64) - np.asarray(sums[b], np.float64)
  m = cluster_mean(diff, np.full(diff.shape, tokens_per_window))
  z = m.mean / m.stderr if m.stderr > 0 else math.nan
  if math.isnan(z) or abs(z) < Z_95:
    verdict = "no measurable change"
  else:
    verdict = f"{a} lower" if m.mean < 0 else f"{b} lower"
  row = {"a": a, "b": b, "delta_nll_diff": m.mean,
         "delta_nll_diff_stderr": m.stderr, "z": z,
         "ci95_low": m.mean - Z_95 * m.stderr,
         "ci95_high": m.mean + Z_95 * m.stderr,
         "num_windows": m.num_windows, "verdict": verdict}
  if kl_sums and a in kl_sums and b in kl_sums:
    kl = cluster_mean(np.asarray(kl_sums[a], np.float64)
                      - np.asarray(kl_sums[b], np.float64),
                      np.full(diff.shape, tokens_per_window))
    row.update(kl_diff=kl.mean, kl_diff_stderr=kl.stderr,
               kl_z=kl.mean / kl.stderr if kl.stderr > 0 else math.nan)
  return row


def write_pairs_csv(path: str | os.PathLike, rows: Sequence[dict]) -> None:
  columns = ["a", "b", "delta_nll_diff", "delta_nll_diff_stderr", "z",
             "ci95_low", "ci95_high", "num_windows", "verdict", "kl_diff",
             "kl_diff_stderr", "kl_z"]
  lines = [",".join(columns)]
  for r in rows:
    lines.append(",".join(
        f"{r[c]:.6g}" if isinstance(r.get(c), float) else str(r.get(c, ""))
        for c in columns))
  with open(path, "w", encoding="utf-8") as f:
    f.write("\n".join(lines) + "\n")
