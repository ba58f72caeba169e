"""`text_file`: a local UTF-8 text file as windows of seq_len + 1 byte tokens (`builder_kwargs`: path, seq_len)."""

import abc
import dataclasses
import os
from collections.abc import Iterator

import numpy as np
import tensorflow_datasets as tfds

from jaxdp.config import ConfigError
from jaxdp.data import arrays, source
from jaxdp.datasets import fingerprint

VOCAB_SIZE = 256  # Byte-level tokens.


def windows(tokens: np.ndarray, seq_len: int, stride: int) -> Iterator[dict[str, np.ndarray]]:
  """Windows of seq_len + 1 tokens starting every `stride` tokens, as {inputs, targets} (next tokens)."""
  for start in range(0, len(tokens) - seq_len, stride):
    w = tokens[start:start + seq_len + 1]
    yield {"inputs": w[:-1].astype(np.int32), "targets": w[1:].astype(np.int64)}


def encode(text: str) -> np.ndarray:
  """UTF-8 bytes of `text` as token ids."""
  return np.frombuffer(text.encode("utf-8"), np.uint8).astype(np.int32)


def decode(tokens: np.ndarray) -> str:
  """Token ids (bytes) back to text; a multi-byte character cut in half becomes U+FFFD."""
  return bytes(np.asarray(tokens, np.uint8).tolist()).decode("utf-8", errors="replace")


@dataclasses.dataclass
class WindowConfig(tfds.core.BuilderConfig):
  """How the text is cut into examples."""
  seq_len: int = 128    # Tokens per example (the model's context).
  stride: int = 0       # Train windows start every `stride` tokens (0: seq_len, no overlap); eval: always seq_len.


class WindowedText(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """Byte-level windows over the texts of named splits; subclasses say where the texts come from."""

  VERSION = tfds.core.Version("1.1.0")  # 1.1.0: prepared as ArrayRecord (random access); same examples.
  TRAIN_SPLIT = "train"

  @staticmethod
  def window_config(name: str, seq_len: int, stride: int, description: str) -> WindowConfig:
    arrays.check_windows(seq_len, stride)
    return WindowConfig(name=name, seq_len=seq_len, stride=stride or seq_len, description=description)

  @abc.abstractmethod
  def _texts(self) -> dict[str, bytes]:
    """The raw bytes of each split."""

  def _info(self) -> tfds.core.DatasetInfo:
    t = self.builder_config.seq_len
    return tfds.core.DatasetInfo(
        builder=self,
        description=f"Byte-level windows of {t} + 1 tokens. {self.builder_config.description}",
        features=tfds.features.FeaturesDict({
            "inputs": tfds.features.Tensor(shape=(t,), dtype=np.int32),
            "targets": tfds.features.Sequence(tfds.features.ClassLabel(num_classes=VOCAB_SIZE), length=t),
        }),
        supervised_keys=("inputs", "targets"),
    )

  def _split_generators(self, dl_manager: tfds.download.DownloadManager) -> dict:
    del dl_manager  # The texts are local (or read from another prepared TFDS dataset).
    t = self.builder_config.seq_len
    gens = {}
    for split, text in self._texts().items():
      if len(text) <= t:
        raise ConfigError(f"split {split!r} of {self.name!r} has {len(text)} bytes, fewer than seq_len + 1 ({t + 1})")
      stride = self.builder_config.stride if split == self.TRAIN_SPLIT else t  # Eval: each target once.
      gens[split] = self._generate_examples(np.frombuffer(text, np.uint8), t, stride)
    return gens

  def _generate_examples(self, tokens: np.ndarray, seq_len: int, stride: int) -> Iterator[tuple[int, dict]]:
    yield from enumerate(windows(tokens, seq_len, stride))


class TextFile(WindowedText):
  """A local UTF-8 text file: `train` is its first (1 - test_fraction) bytes, `test` the rest."""

  RELEASE_NOTES = {"1.0.0": "Byte tokens; train = first (1 - test_fraction), test = the rest.",
                   "1.1.0": "Prepared as ArrayRecord (random access); same examples."}

  def __init__(self, *, path: str | None = None, seq_len: int = 128, stride: int = 0, test_fraction: float = 0.1,
               **kwargs):
    if not path:
      raise ConfigError("dataset 'text_file' needs a path: set config.dataset.builder_kwargs.path")
    self.path = fingerprint.checked_source(path, test_fraction, "text file", os.path.isfile)
    self.test_fraction = test_fraction
    # A prepared copy is for this file (path, size, mtime) and these windows only.
    name = fingerprint.config_name(self.path, source.file_stats([self.path]),
                                   {"seq_len": seq_len, "stride": stride, "test_fraction": test_fraction})
    kwargs["config"] = self.window_config(name, seq_len, stride, f"Text file {self.path}.")
    super().__init__(**kwargs)

  def _texts(self) -> dict[str, bytes]:
    with open(self.path, "rb") as f:
      text = f.read()
    try:
      text.decode("utf-8")
    except UnicodeDecodeError as e:
      raise ConfigError(f"text file {self.path!r} is not UTF-8: {e}") from None
    cut = len(text) - int(round(len(text) * self.test_fraction))
    return {"train": text[:cut], "test": text[cut:]}
