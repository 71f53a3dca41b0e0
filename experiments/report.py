r"""One markdown table of every result under a folder, and Pareto plots.

  python -m experiments.report --runs=runs/ [--out=results.md]
      [--plot=pareto.png]

Reads every metrics.json (experiments.run) and sweep.csv (experiments.sweep,
with the config.json and run_info.json beside it) under --runs, at any
depth; other files are skipped with a note. One table per group of
comparable rows (model, data, windows, scoring, baseline PPL), each with
preset, stored and effective bits, bytes/token, ΔPPL with its 95% CI, KL
and top-1 ± stderr. Prints the markdown, or writes it to --out. --plot
writes effective bits vs ΔPPL with the Pareto front: the file itself for one
group, PLOT-1.png, PLOT-2.png, ... for several. Details:
kvq_jax/report/results_collect.py and results_table.py.
"""

from absl import app
from absl import flags

from kvq_jax.cli.entry import run_main
from kvq_jax.report.results_table import write_report

_RUNS = flags.DEFINE_string("runs", "runs", "folder searched for results")
_OUT = flags.DEFINE_string("out", None,
                           "markdown file to write (default: print it)")
_PLOT = flags.DEFINE_string("plot", None, "Pareto PNG to write (optional)")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  text = write_report(_RUNS.value, out=_OUT.value, plot=_PLOT.value)
  if _OUT.value is None:
    print(text, end="")


if __name__ == "__main__":
  run_main(main)
