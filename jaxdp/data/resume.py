"""The resume contract: what the train stream depends on besides the step (`stream_spec`, saved with every
checkpoint) and the check that a restored run continues that stream exactly (`check_resume`).

A spec names the version of jaxdp's order (`VERSION`): a checkpoint whose stream another version wrote is refused
in one line, as any other change of its stream is; nothing is upgraded.
"""

from typing import Any

from jaxdp.config import ConfigError
from jaxdp.data import images
from jaxdp.data.dataset import Dataset

VERSION = 2  # Of the order of examples and of their augmentation draws: bump it whenever either changes.
GLOBAL = "global"  # The spec's `order`: one global order, read by index (sampler.GlobalOrder).


def stream_spec(ds: Dataset, split: str, *, seed: int, global_batch: int, process_count: int) -> dict[str, Any]:
  """What the train batches depend on besides the step: save it with the step, compare on restore.

  The order of examples (its version; dataset and version, or in-memory data's digest; source kind, split, seed,
  global batch), the features a batch holds, and their augmentation (crop_padding, flip, image_size, crop recipe).
  Never the process count: every count reads the same global batches.
  """
  del process_count
  pre = ds.options.preprocess
  spec = {"version": VERSION, "dataset": ds.corpus.facts.name, "source": ds.kind, "order": GLOBAL, "split": split,
          "seed": seed, "global_batch": global_batch, "features": sorted(ds.element_spec()),
          "crop_padding": pre.crop_padding, "flip": pre.flip, "image_size": pre.image_size}
  if pre.image_size:
    spec["crop"] = images.RECIPE
  return spec


def check_resume(saved: dict[str, Any], current: dict[str, Any]) -> None:
  """Raises unless resuming at the saved step continues the saved stream exactly (no replay, no skip)."""
  if saved.get("version") != current.get("version"):
    raise ConfigError(f"the checkpoint's input stream is of jaxdp's order version {saved.get('version', 1)}, this "
                      f"jaxdp reads version {current.get('version')}: it cannot continue that stream; start in a new "
                      f"workdir")
  changed = [f"{k} {saved.get(k)!r} -> {current.get(k)!r}" for k in sorted({*saved, *current})
             if saved.get(k) != current.get(k)]
  if changed:
    raise ConfigError(f"the checkpoint's input stream differs ({'; '.join(changed)}): resuming would replay "
                      f"or skip examples; restore those values or start in a new workdir")
