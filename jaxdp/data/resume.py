"""The resume contract: what the train stream depends on besides the step (`stream_spec`, saved with every
checkpoint) and the check that a restored run continues that stream exactly (`check_resume`)."""

from typing import Any

from jaxdp.config import ConfigError
from jaxdp.data import images
from jaxdp.data.dataset import Dataset


def stream_spec(ds: Dataset, split: str, *, seed: int, global_batch: int, process_count: int) -> dict[str, Any]:
  """What the train batches depend on besides the step: save it with the step, compare on restore.

  The order of examples (dataset and version, source kind, split, seed, global batch) and their
  augmentation (crop_padding, flip, image_size and the crop recipe).
  """
  pre = ds.options.preprocess
  spec = {"dataset": ds.corpus.facts.name, "source": ds.kind, "split": split, "seed": seed,
          "global_batch": global_batch, "shard_by_process": ds.options.shard_by_process,
          "crop_padding": pre.crop_padding, "flip": pre.flip, "image_size": pre.image_size}
  if pre.image_size:
    spec["crop"] = images.RECIPE
  if ds.options.shard_by_process:
    spec.update(process_count=process_count, shuffle_buffer=ds.options.shuffle_buffer)
  return spec


def check_resume(saved: dict[str, Any], current: dict[str, Any]) -> None:
  """Raises unless resuming at the saved step continues the saved stream exactly (no replay, no skip)."""
  changed = [f"{k} {saved.get(k)!r} -> {current.get(k)!r}" for k in sorted({*saved, *current})
             if saved.get(k) != current.get(k)]
  if changed:
    raise ConfigError(f"the checkpoint's input stream differs ({'; '.join(changed)}): resuming would replay or "
                      f"skip examples; restore those values or start in a new workdir")
