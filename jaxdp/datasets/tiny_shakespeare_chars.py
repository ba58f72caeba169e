"""`tiny_shakespeare_chars`: each split of TFDS `tiny_shakespeare` (prepared in the same data_dir) as byte windows."""

import tensorflow_datasets as tfds

from jaxdp.data import tfds_dataset
from jaxdp.datasets.text_file import WindowedText

SOURCE = "tiny_shakespeare"
SPLITS = ("train", "validation", "test")


def source_text(split: str, data_dir: str | None) -> bytes:
  """The whole text of one split of the prepared TFDS `tiny_shakespeare`."""
  builder = tfds.builder(SOURCE, data_dir=data_dir)
  tfds_dataset.check_can_prepare(builder)  # Not prepared and no network: a clear error in seconds, not retries.
  builder.download_and_prepare()
  examples = builder.as_dataset(split=split, shuffle_files=False)
  return b"".join(ex["text"] for ex in tfds.as_numpy(examples))


class TinyShakespeareChars(WindowedText):
  """Byte windows over tiny_shakespeare's splits (each split stays whole, windows never cross them)."""

  RELEASE_NOTES = {"1.0.0": "Byte tokens over tiny_shakespeare train / validation / test.",
                   "1.1.0": "Prepared as ArrayRecord (random access); same examples."}

  def __init__(self, *, seq_len: int = 256, stride: int = 0, data_dir: str | None = None, **kwargs):
    self.source_data_dir = data_dir  # tiny_shakespeare is read from (and prepared in) the same data_dir.
    kwargs["config"] = self.window_config(f"t{seq_len}-s{stride or seq_len}", seq_len, stride,
                                          "Windows over TFDS tiny_shakespeare.")
    super().__init__(data_dir=data_dir, **kwargs)

  def _texts(self) -> dict[str, bytes]:
    return {split: source_text(split, self.source_data_dir) for split in SPLITS}
