"""`python -m jaxdp.evaluate --workdir DIR [--step N] [--split SPLIT]`, or `evaluate`: a checkpoint's `eval/*`."""

import argparse
import json
import logging
import os
import sys
from typing import Any

from jaxdp.runtime import exits, process
from jaxdp.tools import cli, restore

log = logging.getLogger("jaxdp")
USAGE = ("python -m jaxdp.evaluate --workdir DIR [--step N] [--split SPLIT] [--config CONFIG.py] "
         "[--config.key=value ...]")
EXTRA_HELP = ("  --step: the checkpoint to evaluate (default: the newest).\n"
              "  --split: the split to evaluate (default: the config's dataset.eval_split).\n"
              "  --config is optional: the checkpoint's stored config is the default.")
RESULTS_FILE = "evaluate.jsonl"


def evaluate(config: Any = None, workdir: str = "", step: int | None = None, split: str | None = None, *,
             model: Any = None, task: Any = None, eval_data: Any = None) -> tuple[int, dict]:
  """(step, metrics) of checkpoint `step` (newest) on `split`; config None: the stored one; objects: as trained."""
  if not workdir:
    raise restore.ConfigError("jaxdp.evaluate.evaluate needs workdir=, the training run's directory")
  if config is None:
    config = restore.stored_config(workdir, step)
  from jaxdp import checkpoint
  from jaxdp.loop import evaluate as eval_loop  # JAX and the input pipeline: not before `--help` is answered.
  parts, state, step = restore.restore(config, workdir, step, "jaxdp.evaluate.evaluate", model=model, task=task,
                                       eval_data=eval_data)
  log.info("evaluating checkpoint %s/%d on %s", checkpoint.directory(workdir), step, split or config.dataset.eval_split)
  return step, eval_loop.run(parts, state, split)


def main(argv: list[str]) -> int:
  """Prints the metrics as one JSON line; returns the exit status (2 for a config mistake)."""
  return cli.workdir_tool(argv, usage=USAGE, extra_help=EXTRA_HELP,
                          flags=lambda parser: parser.add_argument("--split", default=None), command=_evaluate_command)


def _evaluate_command(ours: argparse.Namespace, config: Any, workdir: str) -> None:
  """Evaluates, prints the record and (process 0) appends it to WORKDIR/evaluate.jsonl."""
  process.init(config)
  step, results = evaluate(config, workdir, ours.step, ours.split)
  record = {"step": step, "split": ours.split or config.dataset.eval_split, **results}
  print(json.dumps(record))
  import jax
  if jax.process_index() == 0:
    with open(os.path.join(workdir, RESULTS_FILE), "a") as f:
      f.write(json.dumps(record) + "\n")


if __name__ == "__main__":
  exits.exit(main(sys.argv))
