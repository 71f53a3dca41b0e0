"""`experiments.run`: one preset against the baseline on the same windows.

* `runner.run`: perplexity, KL and top-1 agreement, bytes per token,
  context in budget, decode speed; writes config.json, metrics.json and
  summary.md (`report.run_summary`).
"""
