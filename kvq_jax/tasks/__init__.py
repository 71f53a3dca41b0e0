"""Downstream tasks through the quantized cache: HumanEval (pass@1, paired
against the baseline) and the lm-evaluation-harness adapter."""
