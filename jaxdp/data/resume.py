"""The resume contract: what the train stream depends on besides the step (`stream_spec`, saved with every
checkpoint) and the check that a restored run continues that stream exactly (`check_resume`).

Specs saved by older jaxdp (before the `order` key) are read by their meaning then: `shard_by_process` False
was the global order; True was either the by-index shard order or the streaming fallback, which they did not
tell apart. Such a spec resumes as whichever of the two the run uses now, with a warning where that may be
wrong: a dataset streamed now was streamed then (jaxdp never removes ArrayRecord files), but one read by
index now may have been converted since (`python -m jaxdp.data.convert`). Refusing every such checkpoint
would strand runs whose stream is the same; newer specs name their order and are checked exactly.
"""

import logging
from typing import Any

from jaxdp.config import ConfigError
from jaxdp.data import images
from jaxdp.data.dataset import Dataset

log = logging.getLogger("jaxdp")

# How the train stream picks each step's examples (the spec's `order`), and what each means in an error.
GLOBAL, SHARD, STREAMED = "global", "shard", "streamed"
ORDERS = {GLOBAL: "one global order, read by index (sampler.GlobalOrder)",
          SHARD: "each process its own shard, read by index (dataset.shard_by_process)",
          STREAMED: "each process streams its TFRecord files through a shuffle buffer (dataset.shard_by_process on "
                    "a dataset prepared as TFRecord only)"}


def order_kind(ds: Dataset) -> str:
  """The kind of order the train stream of `ds` reads by: GLOBAL, SHARD or STREAMED."""
  if ds.streamed:
    return STREAMED
  return SHARD if ds.options.shard_by_process else GLOBAL


def stream_spec(ds: Dataset, split: str, *, seed: int, global_batch: int, process_count: int) -> dict[str, Any]:
  """What the train batches depend on besides the step: save it with the step, compare on restore.

  The order of examples (dataset and version, or in-memory data's digest; source kind, order kind, split, seed,
  global batch; the process count where each process has its own shard, the shuffle buffer where one shuffles
  the stream), the features a batch holds, and their augmentation (crop_padding, flip, image_size, crop recipe).
  """
  pre, order = ds.options.preprocess, order_kind(ds)
  spec = {"dataset": ds.corpus.facts.name, "source": ds.kind, "order": order, "split": split, "seed": seed,
          "global_batch": global_batch, "features": sorted(ds.element_spec()), "crop_padding": pre.crop_padding,
          "flip": pre.flip, "image_size": pre.image_size}
  if pre.image_size:
    spec["crop"] = images.RECIPE
  if order != GLOBAL:
    spec["process_count"] = process_count
  if order == STREAMED:
    spec["shuffle_buffer"] = ds.options.shuffle_buffer
  return spec


def check_resume(saved: dict[str, Any], current: dict[str, Any]) -> None:
  """Raises unless resuming at the saved step continues the saved stream exactly (no replay, no skip)."""
  saved = _upgraded(saved, current)
  changed = [f"{k} {saved.get(k)!r} -> {current.get(k)!r}" for k in sorted({*saved, *current})
             if saved.get(k) != current.get(k)]
  if changed:
    orders = "" if saved.get("order") == current.get("order") else (
        f" (was {ORDERS.get(saved.get('order'), saved.get('order'))}; now {ORDERS.get(current.get('order'))})")
    raise ConfigError(f"the checkpoint's input stream differs ({'; '.join(changed)}){orders}: resuming would replay "
                      f"or skip examples; restore those values or start in a new workdir")


def _upgraded(saved: dict[str, Any], current: dict[str, Any]) -> dict[str, Any]:
  """A spec saved before the `order` key, as the current code writes that stream (see the module docstring); one
  saved before the `features` key held the supervised features only, in the same order: it names the current ones."""
  if "features" not in saved and "features" in current:
    saved = {**saved, "features": current["features"]}
  if "order" in saved or "shard_by_process" not in saved:
    return saved
  saved = dict(saved)
  if not saved.pop("shard_by_process"):
    saved["order"] = GLOBAL
  elif current.get("order") in (SHARD, STREAMED):
    saved["order"] = current["order"]
    if current["order"] == SHARD:
      log.warning("the checkpoint's stream spec predates jaxdp telling the streaming fallback from reads by index: "
                  "resuming as reads by index; if this dataset was converted to ArrayRecord since that checkpoint "
                  "was saved, the order of examples differs: start in a new workdir")
  else:
    saved["order"] = SHARD  # Was shard_by_process, is not now: refused as an order change.
  if saved["order"] != STREAMED:
    saved.pop("shuffle_buffer", None)  # Only the streaming fallback ever used it.
  return saved
