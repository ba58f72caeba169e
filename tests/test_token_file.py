"""Token corpora as one flat memory-mapped file: windows by global index, splits, writer, sidecar."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from jaxdp import data, train
from jaxdp.report import metrics
from jaxdp.config import ConfigError
from jaxdp.configs import gpt_token_file
from jaxdp.data import arrays as token_windows
from jaxdp.datasets import token_file


def test_windows_are_next_token_shifts_at_stride(tmp_path):
  path = str(tmp_path / "t.bin")
  token_file.write(np.arange(1000) % 700, path)
  w = token_windows.TokenWindows(path, seq_len=8, stride=5)
  assert w.vocab_size == 700 and w.dtype == "uint16" and len(w) == (1000 - 9) // 5 + 1
  batch = w.read(np.array([0, 3, len(w) - 1]))
  starts = np.array([0, 15, (len(w) - 1) * 5])
  expected = (starts[:, None] + np.arange(9)) % 700
  assert batch["inputs"].dtype == np.int32 and batch["labels"].dtype == np.int32
  np.testing.assert_array_equal(batch["inputs"], expected[:, :-1])
  np.testing.assert_array_equal(batch["labels"], expected[:, 1:])
  np.testing.assert_array_equal(w[3]["inputs"], expected[1, :-1])
  for outside in (len(w), -1):
    with pytest.raises(IndexError):
      w.read(np.array([0, outside]))


def test_uint32_vocabulary_and_sidecar(tmp_path):
  path = str(tmp_path / "big_vocab.bin")
  tokens = np.array([0, 70_000, 99_999, 5] * 10)
  with token_file.Writer(path, vocab_size=100_000) as writer:
    writer.append(tokens[:17])
    writer.append(tokens[17:])
  assert json.load(open(path + ".json")) == {"dtype": "uint32", "vocab_size": 100_000, "num_tokens": 40}
  w = token_windows.TokenWindows(path, seq_len=4)
  np.testing.assert_array_equal(w[0]["inputs"], [0, 70_000, 99_999, 5])
  with pytest.raises(ValueError, match="100000"):
    token_file.Writer(str(tmp_path / "x.bin"), vocab_size=100_000).append([100_000])


def test_ids_take_uint16_up_to_a_vocabulary_of_2_16(tmp_path):
  with token_file.Writer(str(tmp_path / "a.bin"), 2**16) as a, token_file.Writer(str(tmp_path / "b.bin"), 2**16 + 1) as b:
    assert (a.dtype, b.dtype) == ("uint16", "uint32")


def test_nanogpt_file_without_sidecar_needs_vocab_size(tmp_path):
  path = tmp_path / "train.bin"
  (np.arange(100) % 50).astype(np.uint16).tofile(path)  # As nanoGPT's prepare.py writes it.
  with pytest.raises(ConfigError, match="vocab_size"):
    token_windows.TokenWindows(str(path), seq_len=4)
  w = token_windows.TokenWindows(str(path), seq_len=4, vocab_size=50)
  np.testing.assert_array_equal(w[2]["labels"], [9, 10, 11, 12])
  (np.arange(3)).astype(np.uint8).tofile(tmp_path / "odd.bin")
  with pytest.raises(ConfigError, match="whole number of uint16"):
    token_windows.TokenWindows(str(tmp_path / "odd.bin"), seq_len=1, vocab_size=50)


def test_split_by_fraction_and_by_two_files(tmp_path):
  path = str(tmp_path / "all.bin")
  token_file.write(np.arange(100), path, vocab_size=128)  # Token i at position i.
  splits = token_windows.splits(path, seq_len=4, stride=2, test_fraction=0.2)
  train, test = splits["train"], splits["test"]
  assert (train.stop, test.start, test.stop) == (80, 80, 100)  # The last 20% of the tokens is `test`.
  assert len(train) == (80 - 5) // 2 + 1 and len(test) == (20 - 5) // 4 + 1  # Eval stride = seq_len.
  assert train.read(np.arange(len(train)))["labels"].max() < 80  # No train target comes from the test tokens.
  np.testing.assert_array_equal(test[0]["inputs"], [80, 81, 82, 83])
  token_file.write(np.arange(30), str(tmp_path / "val.bin"), vocab_size=128)
  two = token_windows.splits(path, seq_len=4, eval_path=str(tmp_path / "val.bin"))
  assert (len(two["train"]), len(two["test"])) == (24, 7)
  token_file.write(np.arange(30), str(tmp_path / "other.bin"), vocab_size=30)
  with pytest.raises(ConfigError, match="different vocabularies"):
    token_windows.splits(path, seq_len=4, eval_path=str(tmp_path / "other.bin"))
  with pytest.raises(ConfigError, match="fewer than seq_len"):
    token_windows.splits(path, seq_len=30, test_fraction=0.2)
  for fraction in (0, 1):
    with pytest.raises(ConfigError, match="test_fraction must be in"):
      token_windows.splits(path, seq_len=4, test_fraction=fraction)
  assert token_windows.splits(path, seq_len=4, test_fraction=0.157)["test"].start == 84  # 15.7 test tokens: 16.


def test_the_config_may_widen_the_vocabulary_but_not_contradict_the_sidecar(tmp_path):
  path = str(tmp_path / "t.bin")
  token_file.write(np.arange(100) % 50, path, vocab_size=50)  # uint16, vocabulary 50.
  for vocab_size in (50, 64):  # The file's, or padded (as nanoGPT's 50304).
    assert token_windows.TokenWindows(path, seq_len=4, vocab_size=vocab_size).vocab_size == vocab_size
  assert token_windows.TokenWindows(path, seq_len=4, dtype="uint16").dtype == "uint16"
  with pytest.raises(ConfigError, match="holds uint16 tokens .* not dataset dtype 'uint32'"):
    token_windows.TokenWindows(path, seq_len=4, dtype="uint32")
  with pytest.raises(ConfigError, match="vocab_size 40 is smaller than .* vocabulary \\(50"):
    token_windows.TokenWindows(path, seq_len=4, vocab_size=40)


def test_the_datasets_name_changes_with_either_file(tmp_path):
  train_path, val_path = str(tmp_path / "train.bin"), str(tmp_path / "val.bin")
  token_file.write(np.arange(300) % 50, train_path, vocab_size=50)
  token_file.write(np.arange(100) % 50, val_path, vocab_size=50)
  name = lambda: data.load(tiny_gpt_on(train_path, eval_path=val_path, seq_len=8).dataset).name
  before = name()
  token_file.write(np.arange(120) % 50, val_path, vocab_size=50)
  assert name() != before and name().startswith("token_file:train.bin@")
  with pytest.raises(ConfigError, match=r"unknown split 'validation' .* \(choose from train, test\)"):
    data.load(tiny_gpt_on(train_path, seq_len=8).dataset).source("validation")


def test_text_file_converts_to_byte_tokens(tmp_path):
  text = "héllo, wörld\n" * 50
  (tmp_path / "book.txt").write_text(text, encoding="utf-8")
  token_file.main([str(tmp_path / "book.txt"), str(tmp_path / "book.bin")])
  w = token_windows.TokenWindows(str(tmp_path / "book.bin"), seq_len=20)
  assert w.vocab_size == 256 and len(w.tokens) == len(text.encode())
  assert bytes(w.tokens[:20].astype(np.uint8)) == text.encode()[:20]


def test_reading_windows_does_not_load_the_file(tmp_path):
  path = tmp_path / "huge.bin"
  with open(path, "wb") as f:
    f.truncate(2**31)  # 2 GiB of zeros (a sparse file: instant, no disk).
  json.dump({"dtype": "uint16", "vocab_size": 256}, open(str(path) + ".json", "w"))
  w = token_windows.TokenWindows(str(path), seq_len=64)
  assert isinstance(w.tokens, np.memmap)
  batch = w.read(np.array([0, len(w) // 2, len(w) - 1]))
  assert batch["inputs"].shape == (3, 64) and not batch["inputs"].any()


# End to end: a token file trains a GPT through jaxdp.data's random-access path.

def tiny_gpt_on(path: str, eval_path: str | None = None, seq_len: int = 16, **overrides):
  """gpt_token_file with a 1-layer GPT, a few steps, no checkpoints."""
  config = gpt_token_file.get_config()
  config.model.update(num_layers=1, num_heads=2, embed_dim=32, mlp_ratio=2)
  config.dataset.builder_kwargs.update(path=path, eval_path=eval_path, seq_len=seq_len)
  config.update(batch_size=16, eval_batch_size=16, num_train_steps=20, log_every_steps=5, eval_every_steps=1000,
                warmup_steps=2, learning_rate=1e-2, checkpoint_every_steps=0)
  config.update(overrides)
  return config


def test_a_token_file_trains_a_gpt(tmp_path):
  path = str(tmp_path / "train.bin")
  token_file.write((np.arange(6000) * 7) % 61, path, vocab_size=64)  # A cycle of 61 tokens: learnable.
  config = tiny_gpt_on(path)
  result = train.train_and_evaluate(config, str(tmp_path / "run"))
  losses = [r["train/loss"] for r in metrics.read(str(tmp_path / "run")) if "train/loss" in r]
  assert losses[0] > 3.0 and losses[-1] < 0.5 * losses[0], losses
  print(losses)  # ln(64) = 4.16 at the start.
  test = token_windows.splits(path, seq_len=16)["test"]
  assert result.eval_metrics["eval/num_examples"] == len(test) == (600 - 17) // 16 + 1  # Each window once.


PROBE = """
import json, resource, sys
from jaxdp import train
from tests.test_token_file import tiny_gpt_on
peaks = []
for path, workdir in zip(sys.argv[1:3], sys.argv[3:5]):
  config = tiny_gpt_on(path, eval_path=sys.argv[5], seq_len=128, batch_size=8, eval_batch_size=8, num_train_steps=3,
                       log_every_steps=1)
  result = train.train_and_evaluate(config, workdir)
  assert int(result.backend.get(result.state.step)) == 3
  peaks.append(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)  # Linux: KiB.
print(json.dumps(peaks))
"""


def test_a_token_file_larger_than_the_memory_budget_trains(tmp_path):
  """Training on a 512 MiB token file raises the peak RSS by far less than the file: it is never loaded."""
  small, big, val = (str(tmp_path / n) for n in ("small.bin", "big.bin", "val.bin"))
  token_file.write(np.arange(4096) % 256, small, vocab_size=256)
  token_file.write(np.arange(2048) % 256, val, vocab_size=256)
  size = 512 * 2**20
  with open(big, "wb") as f:
    f.truncate(size)  # Sparse zeros: instant, no disk; reading a page still maps it into RSS.
  json.dump({"dtype": "uint16", "vocab_size": 256}, open(big + ".json", "w"))
  budget = size // 4  # The growth the test allows itself: a quarter of the file.
  env = {**os.environ, "XLA_FLAGS": os.environ["XLA_FLAGS"] + " --xla_force_host_platform_device_count=2",
         "JAX_PLATFORMS": "cpu"}
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  out = subprocess.run([sys.executable, "-c", PROBE, small, big, str(tmp_path / "w1"), str(tmp_path / "w2"), val],
                       env=env, cwd=root, capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
  after_small, after_big = json.loads(out.stdout.strip().splitlines()[-1])
  print(f"peak RSS after the 8 KiB file {after_small / 2**20:.0f} MiB, after the 512 MiB file "
        f"{after_big / 2**20:.0f} MiB: growth {(after_big - after_small) / 2**20:.1f} MiB")
  assert after_big - after_small < budget


def test_token_file_batches_are_the_same_for_any_process_count_and_resume(tmp_path):
  path = str(tmp_path / "t.bin")
  token_file.write(np.arange(3000), path, vocab_size=3000)  # Token i at position i.
  ds = data.load(tiny_gpt_on(path, seq_len=8).dataset)
  assert ds.num_classes == 3000 and ds.input_shape == (8,) and ds.integer_inputs

  def global_batches(processes: int, start: int, steps: int) -> list[np.ndarray]:
    streams = [data.train_batches(ds, "train", seed=3, global_batch=16, start_step=start, process_index=p,
                                  process_count=processes) for p in range(processes)]
    return [np.concatenate([next(s)["inputs"] for s in streams]) for _ in range(steps)]

  one = global_batches(1, 0, 40)  # 337 windows: 21 steps per epoch, so this crosses an epoch.
  for a, b in zip(one, global_batches(4, 0, 40)):
    np.testing.assert_array_equal(a, b)
  for a, b in zip(one[25:], global_batches(2, 25, 15)):
    np.testing.assert_array_equal(a, b)
  first = np.concatenate(one[:21])[:, 0]  # The first token of each window of epoch 0: every window at most once.
  assert len(set(first.tolist())) == len(first) == 21 * 16


def test_a_rewritten_token_file_is_refused_on_resume(tmp_path):
  """The stream spec names the file by its size and mtime: rewriting it in place changes the dataset."""
  path = str(tmp_path / "t.bin")
  token_file.write(np.arange(3000) % 50, path, vocab_size=50)

  def spec() -> dict:
    ds = data.load(tiny_gpt_on(path, seq_len=8).dataset)
    return data.stream_spec(ds, "train", seed=0, global_batch=16)

  saved, stat = spec(), os.stat(path)
  data.check_resume(saved, spec())  # The same file: the same stream.
  token_file.write(np.arange(3200) % 50, path, vocab_size=50)  # Longer; the mtime put back as it was.
  os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
  with pytest.raises(ConfigError, match="dataset 'token_file:t.bin@"):
    data.check_resume(saved, spec())
  token_file.write((np.arange(3000) + 1) % 50, path, vocab_size=50)  # The same size, other tokens, a later mtime.
  os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
  assert os.path.getsize(path) == stat.st_size
  with pytest.raises(ConfigError, match="dataset 'token_file:t.bin@"):
    data.check_resume(saved, spec())
