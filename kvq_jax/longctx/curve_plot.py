"""Plot of a context curve: ΔPPL (95% CI) and KL against L (PNG, Agg)."""

from __future__ import annotations

import math
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  pylint: disable=g-import-not-at-top


def _error_bars(values: list[float], lows: list[float], highs: list[float]
                ) -> list[list[float]]:
  """[[below], [above]] for `errorbar`; 0 where the interval is undefined
  (one window: NaN), so the point is drawn without a bar."""
  below = [0.0 if math.isnan(lo) else v - lo for v, lo in zip(values, lows)]
  above = [0.0 if math.isnan(hi) else hi - v for v, hi in zip(values, highs)]
  return [below, above]


def curve_plot(rows: list[dict], path: str | os.PathLike, *,
               title: str = "KV-cache quantization against context") -> None:
  """Two panels, one line per point over the contexts (log2 x axis): ΔPPL
  with its paired 95% CI as error bars (symlog y: changes span 0.01 to
  hundreds and can dip below 0) and KL(baseline ‖ quant) with ± its
  window-clustered stderr (log y when every KL is > 0). `rows` are the
  CSV's (context_curve.csv)."""
  fig, (ax_ppl, ax_kl) = plt.subplots(1, 2, figsize=(12, 5), dpi=120)
  names = list(dict.fromkeys(r["name"] for r in rows))
  for name in names:
    line = sorted((r for r in rows if r["name"] == name),
                  key=lambda r: r["context"])
    xs = [r["context"] for r in line]
    delta = [r["delta_ppl"] for r in line]
    ax_ppl.errorbar(xs, delta, yerr=_error_bars(
        delta, [r["delta_ppl_ci95_low"] for r in line],
        [r["delta_ppl_ci95_high"] for r in line]), marker="o", capsize=3,
                    label=name)
    kl = [r["kl_mean"] for r in line]
    stderr = [r["kl_stderr"] for r in line]
    ax_kl.errorbar(xs, kl, yerr=_error_bars(
        kl, [k - s for k, s in zip(kl, stderr)],
        [k + s for k, s in zip(kl, stderr)]), marker="o", capsize=3,
                   label=name)
  contexts = sorted({r["context"] for r in rows})
  for ax in (ax_ppl, ax_kl):
    ax.set_xscale("log", base=2)
    ax.set_xticks(contexts, [str(c) for c in contexts])
    ax.minorticks_off()
    ax.set_xlabel("context L (tokens per window)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
  ax_ppl.set_yscale("symlog", linthresh=0.01)
  ax_ppl.axhline(0.0, color="0.7", lw=0.8)
  ax_ppl.set_ylabel("ΔPPL vs full-precision cache, 95% CI (symlog)")
  if rows and all(r["kl_mean"] > 0 for r in rows):  # Formats span decades.
    ax_kl.set_yscale("log")
  ax_kl.set_ylabel("KL(baseline ‖ quantized), nats ± stderr (log)")
  fig.suptitle(title, fontsize=10)
  fig.tight_layout()
  fig.savefig(path)
  plt.close(fig)
