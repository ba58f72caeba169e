"""Work-arounds for TFDS's own faults, installed once where jaxdp makes its builders (`tfds_dataset`).

- `DatasetInfo.initialize_from_bucket`, which every builder of a dataset not yet prepared calls, makes a temp dir
  before it asks GCS for the dataset's info, and leaves it behind. With GCS off (TFDS's default) the answer is
  always "nothing", so each such builder left one empty /tmp/tmp*tfds dir (thousands on a machine that runs the
  tests). With GCS off it now returns at once; with GCS on it runs as TFDS wrote it.
"""

import functools

from tensorflow_datasets.core import dataset_info
from tensorflow_datasets.core.utils import gcs_utils


def install() -> None:
  """Patches TFDS once (a second call is a no-op)."""
  original = dataset_info.DatasetInfo.initialize_from_bucket
  if getattr(original, "jaxdp_fixed", False):
    return

  @functools.wraps(original)
  def initialize_from_bucket(self: dataset_info.DatasetInfo) -> None:
    if getattr(gcs_utils, "_is_gcs_disabled", False):  # What TFDS itself reads: no GCS, no info, no temp dir.
      return
    original(self)

  initialize_from_bucket.jaxdp_fixed = True
  dataset_info.DatasetInfo.initialize_from_bucket = initialize_from_bucket
