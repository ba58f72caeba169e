"""The input pipeline: tfds (or any random-access source) -> one seeded global order -> each process's rows of
every global batch -> numpy host batches. Knows nothing of models or devices.

The modules, in the order the data flows through them:

- `kinds`: `load(config)` -> `Dataset` (`dataset`: a `Corpus` of splits, its facts, `Options`), by the kind
  of dataset its name names (one table of matcher and opener): TFDS builders through `tfds_dataset` and
  `prepare` (prepared once as ArrayRecord; `offline`: fail fast without network; `convert`: TFRecord ->
  ArrayRecord), or a token file (`token_file`); or data given
  as Python objects (`in_memory`: a dict of numpy arrays, any random-access source); `source`: the random-access
  `Source` interface.
- `sampler`: which examples global batch `step` holds, a pure function of (seed, step); `rng`, numpy's generator
  keyed by (seed, stream, epoch or step).
- `reader`: step -> this process's rows, read by index and decoded in parallel tf.data workers (in order);
  `host_batches`: the same rows of a split with nothing to decode (cached, token file, in-memory arrays, .npz), read by
  numpy in the caller's thread, bitwise the same batches, no tf.data.
- `images`, `preprocess`: crops of images of varying size (per example, in the tf.data decode); augmentation and
  normalization (per batch, in numpy, keyed by (seed, step) and position).
- `train_stream`: `train_batches`, resumable at any step (its docstring states the contract);
  `eval_stream`: `eval_batches`, every example once, padded and masked.
- `resume`: `stream_spec`, saved with every checkpoint, and `check_resume`, which compares it on restore.

TensorFlow is imported where it is used, at its first use (its import takes seconds, and a process that never
decodes nor shuffles never pays it), through `tf_setup.tensorflow()`, so it never takes accelerator memory.
"""

# The package's interface: `from jaxdp import data`, then `data.load`, `data.train_batches`, ...
from jaxdp.data.bad_examples import BadExampleError, ReadError, skipped_through
from jaxdp.data.dataset import Batch, Dataset, Options
from jaxdp.data.eval_stream import eval_batches, num_eval_steps
from jaxdp.data.kinds import load
from jaxdp.data.resume import check_resume, stream_spec
from jaxdp.data.train_stream import train_batches

__all__ = ["BadExampleError", "Batch", "Dataset", "Options", "ReadError", "check_resume", "eval_batches", "load", "num_eval_steps",
           "skipped_through", "stream_spec", "train_batches"]
