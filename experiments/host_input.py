"""What a host batch costs when nothing needs decoding: numpy on the host (`jaxdp.data.host_batches`) against the
tf.data path, and goodput's `time/total/input` of whole runs before and after.

    python experiments/host_input.py batches [--rounds 5] [--batches 200]
    python experiments/host_input.py goodput --before DIR [--after DIR] [--rounds 2]   # checkouts (after: this one)

`batches`: per host batch ms (median over each round's batches, after 10 warm-up batches) of the train stream
for digits cached (128 rows), digits cached with flip and crop_padding 2 (128 rows), a token file (12 x 64,
1 MB of random byte tokens), in-memory arrays (512 x 784 float32, the MLP's rows per process); host and tf.data
rounds alternate; medians and ranges over rounds. `goodput`: the default run (8 simulated devices) and the small
GPT (gpt_token_file: 4 layers, width 128, context 64, batch 12) 400 steps on one device, each a fresh process of
`python -m jaxdp.train`, the older checkout's and this one's alternating; `input` and `wall` from goodput.json.
Results are printed as markdown for experiments/data_notes.md.
"""

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WARMUP = 10


def _token_file(directory: str) -> str:
  """1 MB of random byte tokens (a character corpus's size), written once."""
  import numpy as np
  from jaxdp.datasets import token_file
  path = os.path.join(directory, "chars.bin")
  if not os.path.exists(path):
    token_file.write(np.random.RandomState(0).randint(0, 256, 2**20), path, vocab_size=256)
  return path


def _datasets(directory: str) -> dict:
  """name -> (Dataset, rows per host batch)."""
  import ml_collections
  import numpy as np
  from jaxdp import data
  digits = {"name": "digits", "data_dir": os.path.join(directory, "tfds")}
  rng = np.random.RandomState(0)
  arrays = {"inputs": rng.rand(8192, 784).astype(np.float32), "labels": rng.randint(0, 10, 8192)}
  tokens = {"name": "token_file", "builder_kwargs": {"path": _token_file(directory), "seq_len": 64}}
  return {"digits cached (128)": (data.load(ml_collections.ConfigDict(digits)), 128),
          "digits cached, flip + crop 2 (128)": (
              data.load(ml_collections.ConfigDict({**digits, "flip": True, "crop_padding": 2})), 128),
          "token file (12 x 64)": (data.load(ml_collections.ConfigDict(tokens)), 12),
          "in memory (512 x 784 f32)": (data.load(ml_collections.ConfigDict({}), train_data=arrays), 512)}


def _per_batch_ms(ds, rows: int, host: bool, n: int) -> float:
  """Median ms per batch of `n` batches after the warm-up, the stream pulled as the loop pulls it."""
  from jaxdp import data
  stream = data.train_batches(ds, "train", seed=0, global_batch=rows, start_step=0, process_index=0,
                              process_count=1, stop_step=WARMUP + n, _tf_data=not host)
  for _ in itertools.islice(stream, WARMUP):
    pass
  times = []
  for _ in range(n):
    t = time.perf_counter()
    next(stream)
    times.append((time.perf_counter() - t) * 1e3)
  return statistics.median(times)


def batches(args: argparse.Namespace) -> None:
  sys.path.insert(0, ROOT)
  results: dict = {}
  with tempfile.TemporaryDirectory(prefix="host_input_") as directory:
    for name, (ds, rows) in _datasets(directory).items():
      for _ in range(args.rounds):
        for host in (False, True):
          results.setdefault((name, host), []).append(_per_batch_ms(ds, rows, host, args.batches))
  print(f"load: {os.getloadavg()[0]:.2f}; {args.rounds} alternating rounds of {args.batches} batches\n")
  print("| source (rows) | tf.data ms/batch | host ms/batch | ratio |\n|---|---|---|---|")
  for name in dict.fromkeys(k for k, _ in results):
    tf_data, host = results[(name, False)], results[(name, True)]
    print(f"| {name} | {_cell(tf_data)} | {_cell(host)} | {statistics.median(tf_data) / statistics.median(host):.1f}x |")


def _cell(values: list[float], digits: int = 3) -> str:
  return f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


RUNS = {  # name -> (config file, flags)
    "default digits CNN, 8 devices": ("jaxdp/configs/default.py", ["--cpu_devices", "8"]),
    "small GPT on a token file, 1 device": ("jaxdp/configs/gpt_token_file.py", [
        "--cpu_devices", "1", "--config.num_train_steps=400", "--config.batch_size=12",
        "--config.dataset.builder_kwargs.seq_len=64", "--config.eval_every_steps=1000",
        "--config.checkpoint_every_steps=0", "--config.log_every_steps=100"]),
}


def _run(repo: str, config: str, flags: list[str], directory: str) -> dict:
  """goodput.json's seconds of one fresh run of `repo`'s code."""
  workdir = tempfile.mkdtemp(dir=directory)
  flags = [f.replace("TOKENS", _token_file(directory)) for f in flags]
  env = {**os.environ, "PYTHONPATH": repo}
  subprocess.run([sys.executable, "-m", "jaxdp.train", "--config", os.path.join(repo, config), "--workdir", workdir,
                  *flags], check=True, env=env, cwd=repo, capture_output=True, timeout=900)
  with open(os.path.join(workdir, "goodput.json")) as f:
    return json.load(f)["seconds"]


def goodput(args: argparse.Namespace) -> None:
  sys.path.insert(0, ROOT)
  results: dict = {}
  with tempfile.TemporaryDirectory(prefix="host_input_") as directory:
    for name, (config, flags) in RUNS.items():
      if "token" in config:
        flags = [*flags, "--config.dataset.builder_kwargs.path=TOKENS"]
      for _ in range(args.rounds):
        for label, repo in (("before", args.before), ("after", args.after or ROOT)):
          results.setdefault((name, label), []).append(_run(repo, config, flags, directory))
  print(f"load: {os.getloadavg()[0]:.2f}; {args.rounds} alternating rounds\n")
  print("| run | code | input s | wall s | input share |\n|---|---|---|---|---|")
  for (name, label), runs in results.items():
    inputs, totals = [r["input"] for r in runs], [r["wall"] for r in runs]
    shares = [100 * i / t for i, t in zip(inputs, totals)]
    print(f"| {name} | {label} | {_cell(inputs, 2)} | {_cell(totals, 1)} | {_cell(shares, 1)} % |")


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("mode", choices=["batches", "goodput"])
  parser.add_argument("--rounds", type=int, default=0)
  parser.add_argument("--batches", type=int, default=200)
  parser.add_argument("--before", default="", help="goodput: a checkout of the code to compare against")
  parser.add_argument("--after", default="", help="goodput: the checkout of the new code (default: this one)")
  args = parser.parse_args()
  args.rounds = args.rounds or (5 if args.mode == "batches" else 2)
  (batches if args.mode == "batches" else goodput)(args)


if __name__ == "__main__":
  main()
