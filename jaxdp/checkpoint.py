"""orbax checkpoints under WORKDIR/checkpoints/: asynchronous saves, automatic resume, shape checks.

Each entry holds the full TrainState (as global arrays, whatever the backend), the input position
and the config that produced it. orbax writes an entry to a temporary directory and renames it when
complete, so an entry cut off by a kill is never listed, never loaded.
"""

import json
import os
from collections.abc import Callable, Mapping
from typing import Any

import jax
import ml_collections
import numpy as np
import orbax.checkpoint as ocp
from orbax.checkpoint import checkpoint_managers

from jaxdp.config import ConfigError
from jaxdp.parallel import Backend
from jaxdp.step import TrainState

CHECKPOINT_DIR = "checkpoints"


class Checkpointer:
  """Saves and restores the training state of one workdir."""

  def __init__(self, workdir: str, config: ml_collections.ConfigDict, stream: dict[str, Any] | None = None):
    self.directory = os.path.abspath(os.path.join(workdir, CHECKPOINT_DIR))
    self.config = config
    self.stream = stream  # `data.stream_spec` of the run: stored with each save, checked on restore.
    options = ocp.CheckpointManagerOptions(
        enable_async_checkpointing=config.get("async_checkpointing", True),
        preservation_policy=_preservation_policy(config), cleanup_tmp_directories=True)
    # Handlers named up front, so that a fresh manager can read an existing entry's metadata.
    handlers = {"state": ocp.StandardCheckpointHandler(), "meta": ocp.JsonCheckpointHandler()}
    self.manager = ocp.CheckpointManager(self.directory, options=options, item_handlers=handlers)

  def latest_step(self) -> int | None:
    """The newest complete checkpoint's step, or None."""
    return self.manager.latest_step()

  def restore_or_init(self, backend: Backend, init: Callable[[], TrainState]) -> TrainState:
    """The newest checkpoint's state when there is one, else a fresh `init()`; placed for `backend`."""
    step = self.latest_step()
    if step is None:
      return backend.init(init)
    abstract = backend.abstract_global(jax.eval_shape(init))
    self._check_fits(step, abstract)
    restored = self.manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()))
    return backend.from_global(restored["state"])

  def save(self, step: int, state: TrainState, backend: Backend, metrics: Mapping[str, float] | None = None,
           force: bool = False) -> None:
    """Starts writing `state` as entry `step` (asynchronously); a no-op if that entry exists."""
    if step in self.manager.all_steps():
      return
    meta = {"step": step, "data_position": {"global_batches_consumed": step, "seed": self.config.seed,
                                            "batch_size": self.config.batch_size},
            "config": json.loads(self.config.to_json_best_effort())}
    if self.stream is not None:
      meta["stream"] = self.stream
    self.manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(backend.to_global(state)),
                                                    meta=ocp.args.JsonSave(meta)),
                      metrics=dict(metrics) if metrics else None, force=force)

  def wait(self) -> None:
    """Blocks until pending asynchronous saves are written."""
    self.manager.wait_until_finished()

  def close(self) -> None:
    self.manager.close()

  def _check_fits(self, step: int, abstract: TrainState) -> None:
    """Raises a ConfigError naming what differs when the checkpoint does not fit the config."""
    stored = _shapes(self.manager.item_metadata(step)["state"].tree)
    wanted = _shapes(abstract)
    diffs = [(k, f"{k} is missing from the checkpoint") for k in wanted.keys() - stored.keys()]
    diffs += [(k, f"{k} is in the checkpoint, not in the config's model") for k in stored.keys() - wanted.keys()]
    diffs += [(k, f"{k} is {stored[k]} in the checkpoint, {wanted[k]} in the config")
              for k in wanted.keys() & stored.keys() if stored[k] != wanted[k]]
    # Parameters first: they say what differs; optimizer-state paths only repeat them.
    diffs = [text for key, text in sorted(diffs, key=lambda d: (not d[0].startswith("params/"), d[0]))]
    if diffs:
      more = f" (and {len(diffs) - 3} more)" if len(diffs) > 3 else ""
      raise ConfigError(f"checkpoint {self.directory}/{step} does not fit the config: {'; '.join(diffs[:3])}{more}"
                        " (use another --workdir; the checkpoint is left untouched)")


def _shapes(tree: Any) -> dict[str, str]:
  """'path/to/leaf' -> 'float32[3,4]' for every array leaf of a state or its stored metadata."""
  leaves = jax.tree_util.tree_leaves_with_path(_to_dicts(tree), is_leaf=lambda x: hasattr(x, "shape"))
  return {"/".join(_key(k) for k in path): f"{np.dtype(x.dtype).name}{list(x.shape)}" for path, x in leaves}


def _to_dicts(tree: Any) -> Any:
  """TrainState -> nested dict, so that its paths read like the stored metadata's."""
  return {f.name: getattr(tree, f.name) for f in tree.__dataclass_fields__.values()} if isinstance(tree, TrainState) else tree


def _key(entry: Any) -> str:
  for attr in ("key", "name", "idx"):
    if hasattr(entry, attr):
      return str(getattr(entry, attr))
  return str(entry)


def _preservation_policy(config: ml_collections.ConfigDict) -> checkpoint_managers.PreservationPolicy:
  """Keep the newest `keep_checkpoints`, plus the `keep_best_checkpoints` best by `best_metric`."""
  policies: list = [checkpoint_managers.LatestN(n=config.get("keep_checkpoints", 3))]
  if config.get("keep_best_checkpoints", 0):
    metric, mode = config.get("best_metric", "eval/accuracy"), config.get("best_mode", "max")
    policies.append(checkpoint_managers.BestN(get_metric_fn=lambda m: m[metric], reverse=mode == "min",
                                              n=config.keep_best_checkpoints,
                                              keep_checkpoints_without_metrics=False))
  return checkpoint_managers.AnyPreservationPolicy(policies)
