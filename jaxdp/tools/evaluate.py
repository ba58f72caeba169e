"""Evaluate a checkpoint without training, and the eval loop the training loop uses too (`run`).

    python -m jaxdp.evaluate --workdir DIR [--step N] [--split SPLIT] [--config CONFIG.py]
        [--config.key=value ...] [--cpu_devices N]

Restores the newest checkpoint (or step N) on any device count, evaluates every example of the split
exactly once and prints the same `eval/*` metrics as training (process 0 also appends them, with
`eval/step`, to WORKDIR/evaluate.jsonl). The config defaults to the one the checkpoint stores.
"""

import argparse
import json
import logging
import os
import sys
from typing import Any

from jaxdp.tools import cli, restore
from jaxdp.runtime import exits

log = logging.getLogger("jaxdp")
USAGE = ("python -m jaxdp.evaluate --workdir DIR [--step N] [--split SPLIT] [--config CONFIG.py] "
         "[--config.key=value ...]")
EXTRA_HELP = ("  --step: the checkpoint to evaluate (default: the newest).\n"
              "  --split: the split to evaluate (default: the config's dataset.eval_split).\n"
              "  --config is optional: the checkpoint's stored config is the default.")
RESULTS_FILE = "evaluate.jsonl"


def run(parts: Any, state: Any, split: str | None = None) -> dict[str, float]:
  """`eval/loss`, `eval/accuracy`, `eval/num_examples` over every example of `split` (default: the eval split).

  `parts` is what `build.build` returns; each example counts once, on any device and process count.
  """
  import jax
  import jax.numpy as jnp

  from jaxdp import data
  from jaxdp.report import metrics
  split = split or parts.config.dataset.eval_split
  batches = data.eval_batches(parts.ds, split, global_batch=parts.layout.eval_global_batch,
                              process_index=jax.process_index(), process_count=jax.process_count())
  totals = None
  for batch in batches:
    sums = parts.backend.get(parts.eval_step(state, parts.backend.put_batch(batch)))
    totals = sums if totals is None else jax.tree.map(jnp.add, totals, sums)
  return metrics.summarize_eval(totals)


def evaluate(config: Any, workdir: str, step: int | None = None, split: str | None = None) -> tuple[int, dict]:
  """(step, metrics) of WORKDIR's checkpoint `step` (default: newest) on `split`."""
  parts, state, step = restore.restore(config, workdir, step)
  log.info("evaluating checkpoint %s/%s/%d on %s", os.path.abspath(workdir), restore.CHECKPOINT_DIR, step,
           split or config.dataset.eval_split)
  return step, run(parts, state, split)


def main(argv: list[str]) -> int:
  """Prints the metrics as one JSON line; returns the exit status (2 for a config mistake)."""
  cli.exit_if_help(argv, USAGE, EXTRA_HELP)  # Before the logging setup, which loads JAX.
  cli.setup_logging()
  return cli.guarded(lambda: _evaluate_command(argv))


def _evaluate_command(argv: list[str]) -> None:
  """Parses `argv`, evaluates, prints the record and (process 0) appends it to WORKDIR/evaluate.jsonl."""
  parser = argparse.ArgumentParser(prog="python -m jaxdp.evaluate", add_help=False)
  parser.add_argument("--step", type=int, default=None)
  parser.add_argument("--split", default=None)
  ours, rest = parser.parse_known_args(argv[1:])
  config, workdir = restore.parse(argv[:1] + rest, usage=USAGE, extra_help=EXTRA_HELP, step=ours.step)
  cli.init_process(config)
  step, results = evaluate(config, workdir, ours.step, ours.split)
  record = {"step": step, "split": ours.split or config.dataset.eval_split, **results}
  print(json.dumps(record))
  import jax
  if jax.process_index() == 0:
    with open(os.path.join(workdir, RESULTS_FILE), "a") as f:
      f.write(json.dumps(record) + "\n")


if __name__ == "__main__":
  exits.exit(main(sys.argv))
