"""The `--eval_data` and `--model` flags every experiment script shares (or
`--model` alone), and the parsing of comma-separated integer lists."""

from __future__ import annotations

from absl import app
from absl import flags


def DEFINE_data_flags() -> tuple[flags.FlagHolder, flags.FlagHolder]:  # pylint: disable=invalid-name
  """Defines --eval_data and --model; returns their holders (in that order).

  Both default to None: the standard-library text (WORKSPACE.md) and the
  preset's `config.model`.
  """
  eval_data = flags.DEFINE_string(
      "eval_data", None,
      "UTF-8 text file; default: stdlib sources (WORKSPACE.md)")
  return eval_data, DEFINE_model_flag()


def DEFINE_model_flag() -> flags.FlagHolder:  # pylint: disable=invalid-name
  """Defines --model alone (scripts that read no evaluation text); default
  None: the preset's `config.model`."""
  return flags.DEFINE_string("model", None,
                             "model name or path; default: config.model")


def int_list(holder: flags.FlagHolder) -> tuple[int, ...]:
  """A DEFINE_list flag's values as ints; app.UsageError naming the flag."""
  try:
    return tuple(int(v) for v in holder.value)
  except ValueError as e:
    raise app.UsageError(
        f"--{holder.name}={','.join(holder.value)}: integers only.") from e
