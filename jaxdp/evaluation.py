"""Exact evaluation: every example of a split once, summed on the devices, on any device and process count."""

from typing import Any

import jax

from jaxdp import data
from jaxdp.report import metrics
from jaxdp.tasks import base as task_lib


def exact(backend: Any, eval_step: Any, task: Any, ds: data.Dataset, split: str, global_batch: int,
          state: Any) -> dict[str, float]:
  """`eval/*` of `task` and `eval/num_examples` over every example of `split`, in global batches of `global_batch`,
  summed on the devices by `eval_step`."""
  batches = data.eval_batches(ds, split, global_batch=global_batch, process_index=jax.process_index(),
                              process_count=jax.process_count())
  totals = None
  for batch in batches:
    sums = backend.get(eval_step(state, backend.put_batch(batch)))
    totals = sums if totals is None else task_lib.combine(totals, sums)  # Batches in order: sums, maxima.
  return metrics.summarize_eval(totals, task)
