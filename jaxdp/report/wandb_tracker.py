"""`jaxdp.WandbTracker`: every scalar record the loop writes, logged to Weights & Biases (the `wandb` extra)."""

import contextlib
import os
from collections.abc import Mapping
from typing import Any

from jaxdp.config import ConfigError
from jaxdp.report.hook import Hook, StepInfo
from jaxdp.report.metrics import is_number

RUN_ID_FILE = "wandb_run_id"  # In the workdir: a restarted run logs on to the same W&B run.


class WandbTracker(Hook):
  """Logs every scalar record to one W&B run (process 0), resumed on a restart from WORKDIR/wandb_run_id.

  `project` and `init_kwargs` go to `wandb.init`; its files go to the workdir unless `dir=` or WANDB_DIR says.
  """

  def __init__(self, project: str | None = None, **init_kwargs: Any):
    self.init_kwargs = {"project": project, **init_kwargs}
    self.run = None

  def on_start(self, info: StepInfo) -> None:
    import jax
    if jax.process_index() != 0:
      return
    try:
      import wandb
    except ImportError:
      raise ConfigError("WandbTracker needs wandb: pip install -e '.[wandb]' in your clone of jaxdp") from None
    kwargs = dict(self.init_kwargs)
    if "dir" not in kwargs and "WANDB_DIR" not in os.environ:
      kwargs["dir"] = info.workdir
    path = os.path.join(info.workdir, RUN_ID_FILE)
    with contextlib.suppress(OSError), open(path) as f:  # None (W&B makes one, stored below) on a first start.
      kwargs.setdefault("id", f.read().strip() or None)
    kwargs.setdefault("resume", "allow")
    self.run = wandb.init(**kwargs)
    with open(path, "w") as f:  # After init: an id W&B refused is not kept.
      f.write(self.run.id)

  def on_write(self, step: int, scalars: Mapping[str, float]) -> None:
    if self.run is not None:
      self.run.log({k: float(v) for k, v in scalars.items() if is_number(v)}, step=int(step))

  def close(self) -> None:
    if self.run is not None:
      self.run.finish()
      self.run = None

