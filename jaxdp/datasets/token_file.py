"""Writes token files (`jaxdp.data.arrays` reads them) and their sidecars: `Writer` for your tokenizer's ids.

    python -m jaxdp.datasets.token_file book.txt book.bin   # a text file -> byte tokens (vocabulary 256)
"""

import argparse
import contextlib
import json
from collections.abc import Iterable
from types import TracebackType

import numpy as np

from jaxdp.config import ConfigError
from jaxdp.data.arrays import DTYPES, sidecar_path

BYTE_VOCAB = 256  # Text written as UTF-8 bytes.


class Writer(contextlib.AbstractContextManager):
  """Appends token ids to a token file; the sidecar is written on close. A context manager."""

  def __init__(self, path: str, vocab_size: int):
    if not (isinstance(vocab_size, int) and 0 < vocab_size <= 2**32):
      raise ConfigError(f"vocab_size must be in [1, 2**32], got {vocab_size!r}")
    self.path, self.vocab_size = path, vocab_size
    self.dtype = "uint16" if vocab_size <= 2**16 else "uint32"
    self.num_tokens = 0
    self._file = open(path, "wb")

  def append(self, tokens: Iterable[int] | np.ndarray) -> None:
    tokens = np.asarray(tokens)
    if tokens.size and (tokens.min() < 0 or tokens.max() >= self.vocab_size):
      raise ValueError(f"token ids must be in [0, {self.vocab_size}), got {tokens.min()}..{tokens.max()}")
    tokens.astype(DTYPES[self.dtype]).tofile(self._file)
    self.num_tokens += tokens.size

  def close(self) -> None:
    self._file.close()
    with open(sidecar_path(self.path), "w") as f:
      json.dump({"dtype": self.dtype, "vocab_size": self.vocab_size, "num_tokens": self.num_tokens}, f)

  def __exit__(self, kind: type | None, value: BaseException | None, tb: TracebackType | None) -> None:
    self.close()


def write(tokens_or_text: str | bytes | np.ndarray, path: str, vocab_size: int | None = None) -> None:
  """Writes text (as UTF-8 byte tokens, vocabulary 256) or token ids (vocabulary: given, or max + 1)."""
  if isinstance(tokens_or_text, (str, bytes)):
    raw = tokens_or_text.encode("utf-8") if isinstance(tokens_or_text, str) else tokens_or_text
    tokens, vocab_size = np.frombuffer(raw, np.uint8), vocab_size or BYTE_VOCAB
  else:
    tokens = np.asarray(tokens_or_text)
    vocab_size = vocab_size or int(tokens.max()) + 1
  with Writer(path, vocab_size) as w:
    w.append(tokens)


def convert_text(src: str, dst: str, chunk_bytes: int = 1 << 24) -> int:
  """A text file's bytes -> a token file (vocabulary 256), streamed in chunks; returns the token count."""
  with open(src, "rb") as f, Writer(dst, BYTE_VOCAB) as w:
    while chunk := f.read(chunk_bytes):
      w.append(np.frombuffer(chunk, np.uint8))
  return w.num_tokens


def main(argv: list[str] | None = None) -> None:
  """CLI: convert a text file into a byte-token file."""
  parser = argparse.ArgumentParser(prog="python -m jaxdp.datasets.token_file", description=convert_text.__doc__)
  parser.add_argument("src", help="a text file")
  parser.add_argument("dst", help="the token file to write (a sidecar DST.json is written too)")
  args = parser.parse_args(argv)
  print(f"{args.dst}: {convert_text(args.src, args.dst):,} tokens (uint16, vocabulary {BYTE_VOCAB})")


if __name__ == "__main__":
  main()
