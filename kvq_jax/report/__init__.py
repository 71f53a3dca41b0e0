"""Run outputs and the tables gathered from them.

* `run_summary`: `experiments.run`'s summary.md and metrics.json.
* `results_collect`, `results_table`: `experiments.report` gathers every
  run and sweep below a folder into one markdown table and plots.
"""
