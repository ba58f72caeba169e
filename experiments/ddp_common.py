"""What both workers of the PyTorch DDP comparison share: the models, the synthetic data, the protocol.

Workers are long-lived processes, one per rank, that read one JSON command per line on stdin and answer
with one line `@@ {json}` on stdout, so the driver can alternate jaxdp and PyTorch groups (A B A B ...)
without paying process start-up and compilation in every round. Commands:
  {"op": "train", "model": "mlp", "batch": 256, "steps": 5}   -> {"times": [seconds per step]}
  {"op": "allreduce", "model": "mlp", "steps": 5}             -> {"times": [...], "bytes": N}
  {"op": "quit"}
`batch` is the global batch; each of the W ranks trains on batch / W rows of it.
"""

import json
import sys
from collections.abc import Callable

import numpy as np

MARK = "@@ "
NUM_CLASSES = 10
# The MLP 784-1024-1024-10 and a small CNN (jaxdp's `cnn`: two 3x3 convs 32, 64, a 2x2 average pool, a
# dense 128, the logits) on 28x28x1 inputs; the same layers in both frameworks.
MODELS = {
    "mlp": {"input_shape": (28, 28, 1), "hidden": (1024, 1024)},
    "cnn": {"input_shape": (28, 28, 1), "features": (32, 64), "dense": 128},
}
LEARNING_RATE = 1e-3  # Adam, default betas and epsilon in both frameworks.


def local_batch(model: str, global_batch: int, rank: int, world: int) -> tuple[np.ndarray, np.ndarray]:
  """This rank's rows of a fixed synthetic global batch: float32 NHWC images, int labels."""
  rng = np.random.default_rng(0)
  shape = MODELS[model]["input_shape"]
  inputs = rng.standard_normal((global_batch, *shape), dtype=np.float32)
  labels = rng.integers(0, NUM_CLASSES, global_batch).astype(np.int32)
  rows = slice(rank * global_batch // world, (rank + 1) * global_batch // world)
  return inputs[rows], labels[rows]


def serve(handle: Callable[[dict], dict]) -> None:
  """Answers commands from stdin until `quit` (or end of input): `@@ {json}` per command."""
  reply({"ready": True})
  for line in sys.stdin:
    command = json.loads(line)
    if command["op"] == "quit":
      break
    reply(handle(command))


def reply(message: dict) -> None:
  print(MARK + json.dumps(message), flush=True)
