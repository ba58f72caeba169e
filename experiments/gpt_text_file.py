"""Trains the `gpt_text_file` config on 1.4 MB of real English, offline, on CPU; plots the loss; samples text.

    python experiments/gpt_text_file.py [--steps 300] [--workdir /tmp/jaxdp-gpt-text]

The text is Python's own bundled documentation, so it exists on every machine with Python: the
`pydoc_data.topics` pages (the Language Reference sections that `help()` shows) followed by the
docstrings of the top-level standard-library modules, their classes and functions. Writes
experiments/gpt_text_file_loss.png and experiments/gpt_text_file_results.md.
"""

import argparse
import ast
import datetime
import glob
import hashlib
import os
import platform
import sys
import sysconfig
import time

import jax
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from jaxdp.report import metrics  # noqa: E402
from jaxdp import models, train
from jaxdp.tools import sample
from jaxdp.configs import gpt_text_file  # noqa: E402
from jaxdp.datasets import text_file  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
PROMPT = "The "


def python_docs() -> str:
  """pydoc topics, then the docstrings of the standard library's top-level modules (sorted: reproducible)."""
  from pydoc_data import topics
  parts = [topics.topics[k] for k in sorted(topics.topics)]
  for path in sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "*.py"))):
    try:
      tree = ast.parse(open(path, encoding="utf-8").read())
    except (SyntaxError, UnicodeDecodeError):
      continue
    parts += [d for node in ast.walk(tree)
              if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
              and (d := ast.get_docstring(node))]
  return "\n\n".join(parts) + "\n"


def printable(text: str) -> str:
  """Control characters (an undertrained model emits some) escaped, so the results file stays text."""
  return "".join(c if c.isprintable() or c in "\n\t" else repr(c)[1:-1] for c in text)


def plot(records: list[dict], path: str, title: str) -> None:
  """Train loss (every logged interval) and eval loss, in nats per byte, against steps."""
  train_pts = [(r["step"], r["train/loss"]) for r in records if "train/loss" in r]
  eval_pts = [(r["step"], r["eval/loss"]) for r in records if "eval/loss" in r]
  fig, ax = plt.subplots(figsize=(7, 4))
  ax.plot(*zip(*train_pts), label="train (mean over each logging interval)")
  ax.plot(*zip(*eval_pts), "o-", label="eval (held-out last 10%)")
  ax.axhline(np.log(256), color="gray", ls=":", label="uniform over 256 bytes (5.55)")
  ax.set_xlabel("step")
  ax.set_ylabel("loss (nats per byte)")
  ax.set_title(title, fontsize=9)
  ax.grid(alpha=0.3)
  ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=120)


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--steps", type=int, default=300)
  parser.add_argument("--workdir", default="/tmp/jaxdp-gpt-text")
  parser.add_argument("--out", default=HERE, help="Where the PNG and the results file go.")
  args = parser.parse_args()
  os.makedirs(args.workdir, exist_ok=True)
  text = python_docs()
  text_path = os.path.join(args.workdir, "python_docs.txt")
  with open(text_path, "w", encoding="utf-8") as f:
    f.write(text)
  raw = text.encode("utf-8")

  config = gpt_text_file.get_config()
  config.dataset.builder_kwargs.path = text_path
  config.dataset.data_dir = os.path.join(args.workdir, "tfds")
  config.num_train_steps = args.steps
  config.log_every_steps, config.eval_every_steps, config.checkpoint_every_steps = 10, 100, args.steps
  run_dir = os.path.join(args.workdir, "run")
  start = time.time()
  result = train.train_and_evaluate(config, run_dir)
  wall = time.time() - start

  records = metrics.read(run_dir)
  seq_len = config.dataset.builder_kwargs.seq_len
  rates = [r["perf/examples_per_second"] * seq_len for r in records if "perf/examples_per_second" in r][1:]
  tokens_per_s = float(np.median(rates))  # The first interval holds compilation: left out.
  test_text = raw[len(raw) - round(len(raw) * config.dataset.builder_kwargs.test_fraction):]
  bytes_per_char = len(test_text) / len(test_text.decode("utf-8", errors="replace"))
  eval_loss = result.eval_metrics["eval/loss"]
  final_train = [r["train/loss"] for r in records if "train/loss" in r][-1]
  model = models.get_model(config.model, (seq_len,), text_file.VOCAB_SIZE)
  params, model_state = result.backend.get(result.state.params), result.backend.get(result.state.model_state)
  text_out = sample.sample_text(model, params, model_state, PROMPT, 400, seq_len=seq_len, seed=0, temperature=0.8)

  n_params = sum(x.size for x in jax.tree.leaves(params))
  png = os.path.join(args.out, "gpt_text_file_loss.png")
  plot(records, png, f"gpt_text_file: {n_params:,} parameters, {len(raw) / 1e6:.2f} MB of Python docs, "
       f"{args.steps} steps x {config.batch_size * seq_len} tokens")
  command = "python experiments/gpt_text_file.py " + " ".join(sys.argv[1:])
  report = f"""# gpt_text_file: a byte-level GPT on 1.4 MB of Python's documentation, on CPU

- date: {datetime.datetime.now().isoformat(timespec="seconds")}
- machine: {platform.platform()}, {os.cpu_count()} CPU cores, jax {jax.__version__} on {jax.device_count()} x {jax.devices()[0].platform} device(s)
- command: `{command.strip()}` ({wall:.0f} s in train_and_evaluate, compilation and dataset preparation included)
- text: {len(raw):,} bytes ({len(text):,} characters), sha256 {hashlib.sha256(raw).hexdigest()[:16]}: Python {platform.python_version()}'s `pydoc_data.topics` and the docstrings of the top-level standard-library modules; train = first 90%, test = last 10%
- model: `gpt`, {config.model.num_layers} layers, {config.model.num_heads} heads, width {config.model.embed_dim}, {config.model.positions} positions, {n_params:,} parameters; context {seq_len} bytes
- training: {args.steps} steps of {config.batch_size} x {seq_len} = {config.batch_size * seq_len:,} tokens, {config.optimizer} lr {config.learning_rate} (warmup {config.warmup_steps}, cosine), weight decay {config.weight_decay}
- throughput: **{tokens_per_s:,.0f} tokens/s** (median over logging intervals, the first left out)
- final train loss (mean of the last 10 steps): {final_train:.3f} nats/byte
- eval loss on the held-out 10%: **{eval_loss:.3f} nats/byte = {eval_loss * bytes_per_char:.3f} nats/character** ({bytes_per_char:.4f} bytes per character; {eval_loss * bytes_per_char / np.log(2):.3f} bits/character); uniform guessing: {np.log(256):.3f}
- loss curve: [gpt_text_file_loss.png](gpt_text_file_loss.png)

Sample (prompt {PROMPT!r}, temperature 0.8, seed 0, from the trained parameters):

```
{printable(text_out)}
```
"""
  with open(os.path.join(args.out, "gpt_text_file_results.md"), "w") as f:
    f.write(report)
  print(report)


if __name__ == "__main__":
  main()
