"""The `--eval_data` and `--model` flags every experiment script shares."""

from __future__ import annotations

from absl import flags


def DEFINE_data_flags() -> tuple[flags.FlagHolder, flags.FlagHolder]:  # pylint: disable=invalid-name
  """Defines --eval_data and --model; returns their holders (in that order).

  Both default to None: the standard-library text (WORKSPACE.md) and the
  preset's `config.model`.
  """
  eval_data = flags.DEFINE_string(
      "eval_data", None,
      "UTF-8 text file; default: stdlib sources (WORKSPACE.md)")
  model = flags.DEFINE_string("model", None,
                              "model name or path; default: config.model")
  return eval_data, model
