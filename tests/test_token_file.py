"""Token corpora as one flat memory-mapped file: windows by global index, splits, writer, sidecar."""

import json

import numpy as np
import pytest

from jaxdp.config import ConfigError
from jaxdp.datasets import token_file


def test_windows_are_next_token_shifts_at_stride(tmp_path):
  path = str(tmp_path / "t.bin")
  token_file.write(np.arange(1000) % 700, path)
  w = token_file.TokenWindows(path, seq_len=8, stride=5)
  assert w.vocab_size == 700 and w.dtype == "uint16" and len(w) == (1000 - 9) // 5 + 1
  batch = w.read(np.array([0, 3, len(w) - 1]))
  starts = np.array([0, 15, (len(w) - 1) * 5])
  expected = (starts[:, None] + np.arange(9)) % 700
  assert batch["inputs"].dtype == np.int32 and batch["labels"].dtype == np.int32
  np.testing.assert_array_equal(batch["inputs"], expected[:, :-1])
  np.testing.assert_array_equal(batch["labels"], expected[:, 1:])
  np.testing.assert_array_equal(w[3]["inputs"], expected[1, :-1])
  with pytest.raises(IndexError):
    w.read(np.array([len(w)]))


def test_uint32_vocabulary_and_sidecar(tmp_path):
  path = str(tmp_path / "big_vocab.bin")
  tokens = np.array([0, 70_000, 99_999, 5] * 10)
  with token_file.Writer(path, vocab_size=100_000) as writer:
    writer.append(tokens[:17])
    writer.append(tokens[17:])
  assert json.load(open(path + ".json")) == {"dtype": "uint32", "vocab_size": 100_000, "num_tokens": 40}
  w = token_file.TokenWindows(path, seq_len=4)
  np.testing.assert_array_equal(w[0]["inputs"], [0, 70_000, 99_999, 5])
  with pytest.raises(ValueError, match="100000"):
    token_file.Writer(str(tmp_path / "x.bin"), vocab_size=100_000).append([100_000])


def test_nanogpt_file_without_sidecar_needs_vocab_size(tmp_path):
  path = tmp_path / "train.bin"
  (np.arange(100) % 50).astype(np.uint16).tofile(path)  # As nanoGPT's prepare.py writes it.
  with pytest.raises(ConfigError, match="vocab_size"):
    token_file.TokenWindows(str(path), seq_len=4)
  w = token_file.TokenWindows(str(path), seq_len=4, vocab_size=50)
  np.testing.assert_array_equal(w[2]["labels"], [9, 10, 11, 12])
  (np.arange(3)).astype(np.uint8).tofile(tmp_path / "odd.bin")
  with pytest.raises(ConfigError, match="whole number of uint16"):
    token_file.TokenWindows(str(tmp_path / "odd.bin"), seq_len=1, vocab_size=50)


def test_split_by_fraction_and_by_two_files(tmp_path):
  path = str(tmp_path / "all.bin")
  token_file.write(np.arange(100), path, vocab_size=128)  # Token i at position i.
  splits = token_file.splits(path, seq_len=4, stride=2, test_fraction=0.2)
  train, test = splits["train"], splits["test"]
  assert (train.stop, test.start, test.stop) == (80, 80, 100)  # The last 20% of the tokens is `test`.
  assert len(train) == (80 - 5) // 2 + 1 and len(test) == (20 - 5) // 4 + 1  # Eval stride = seq_len.
  assert train.read(np.arange(len(train)))["labels"].max() < 80  # No train target comes from the test tokens.
  np.testing.assert_array_equal(test[0]["inputs"], [80, 81, 82, 83])
  token_file.write(np.arange(30), str(tmp_path / "val.bin"), vocab_size=128)
  two = token_file.splits(path, seq_len=4, eval_path=str(tmp_path / "val.bin"))
  assert (len(two["train"]), len(two["test"])) == (24, 7)
  token_file.write(np.arange(30), str(tmp_path / "other.bin"), vocab_size=30)
  with pytest.raises(ConfigError, match="different vocabularies"):
    token_file.splits(path, seq_len=4, eval_path=str(tmp_path / "other.bin"))
  with pytest.raises(ConfigError, match="fewer than seq_len"):
    token_file.splits(path, seq_len=30, test_fraction=0.2)


def test_text_file_converts_to_byte_tokens(tmp_path):
  text = "héllo, wörld\n" * 50
  (tmp_path / "book.txt").write_text(text, encoding="utf-8")
  token_file.main([str(tmp_path / "book.txt"), str(tmp_path / "book.bin")])
  w = token_file.TokenWindows(str(tmp_path / "book.bin"), seq_len=20)
  assert w.vocab_size == 256 and len(w.tokens) == len(text.encode())
  assert bytes(w.tokens[:20].astype(np.uint8)) == text.encode()[:20]


def test_reading_windows_does_not_load_the_file(tmp_path):
  path = tmp_path / "huge.bin"
  with open(path, "wb") as f:
    f.truncate(2**31)  # 2 GiB of zeros (a sparse file: instant, no disk).
  json.dump({"dtype": "uint16", "vocab_size": 256}, open(str(path) + ".json", "w"))
  w = token_file.TokenWindows(str(path), seq_len=64)
  assert isinstance(w.tokens, np.memmap)
  batch = w.read(np.array([0, len(w) // 2, len(w) - 1]))
  assert batch["inputs"].shape == (3, 64) and not batch["inputs"].any()
