"""The eval loop of a `build.build` run (the tools' evaluate), on `evaluation.exact`."""

from typing import Any

from jaxdp import evaluation


def run(parts: Any, state: Any, split: str | None = None) -> dict[str, float]:
  """`eval/*` of a `build.build` run over every example of `split` (default: the eval split)."""
  split = split or parts.config.dataset.eval_split
  return evaluation.exact(parts.backend, parts.eval_step, parts.task, parts.ds, split,
                          parts.layout.eval_global_batch, state)
