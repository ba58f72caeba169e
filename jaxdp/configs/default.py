"""Default: a small CNN on the offline `digits` dataset (8x8 handwritten digits, scikit-learn)."""

import ml_collections
from ml_collections import config_dict


def get_config() -> ml_collections.ConfigDict:
  """The default config; other configs start from it and change a few fields."""
  config = ml_collections.ConfigDict()
  config.seed = 0                    # Seeds parameters, data order and augmentation.
  config.batch_size = 128            # Global batch size. Must be divisible by the number of devices.
  config.eval_batch_size = 0         # Global eval batch size; 0 means batch_size.
  config.num_train_steps = 400       # Optimizer steps.
  # Any optax optimizer by name (adam, adamw, sgd, lion, adafactor, ...), or an optax GradientTransformation (from
  # Python or a config file: its own schedule and decay; of the keys below only max_grad_norm then applies).
  config.optimizer = config_dict.FieldReference("adam", field_type=object)
  # The named optimizer's other keyword arguments ({"b1": 0.95}; sgd: {"momentum": 0.9, "nesterov": True});
  # learning_rate, weight_decay and its mask come from the keys below.
  config.optimizer_kwargs = ml_collections.ConfigDict()
  # Peak learning rate. Must be positive. A schedule object goes in the optimizer: optimizer=optax.adamw(schedule).
  config.learning_rate = config_dict.FieldReference(3e-3, field_type=object)
  config.weight_decay = 0.0          # Decoupled where the optimizer takes weight_decay (adamw, lion), L2 otherwise.
  config.weight_decay_mask = "rank>=2"  # Which decay: rank>=2 (not biases, norm scales) | all | a regex on param paths.
  config.max_grad_norm = 0.0         # Clip the all-reduced gradient to this global norm (also under ZeRO-1); 0: off.
  config.lr_schedule = "constant"    # constant | cosine (cosine decays to 0 at num_train_steps).
  config.warmup_steps = 0            # Linear warmup steps before the schedule.
  config.grad_accum_steps = 1        # Micro-batches per optimizer step (divides the per-device batch); one all-reduce per step.
  config.dtype = "float32"           # Compute dtype of forward and backward (bfloat16: mixed precision); parameters stay float32.
  config.log_every_steps = 50        # Write train metrics every this many steps.
  config.eval_every_steps = 200      # Evaluate on the whole eval split every this many steps (and at the end).
  config.checkpoint_every_steps = 200  # Save WORKDIR/checkpoints/STEP every this many steps (and at the end); 0: never.
  config.keep_checkpoints = 3        # Keep the newest this many checkpoints ...
  config.keep_best_checkpoints = 0   # ... plus this many best by `best_metric` (among evaluated steps).
  config.best_metric = "eval/accuracy"  # Metric that ranks checkpoints for keep_best_checkpoints.
  config.best_mode = "max"           # max | min: which end of best_metric is best.
  config.audit_data = False          # Record the example ids of every step in WORKDIR/audit/ (see jaxdp.audit).
  config.profile_steps = ()          # (first, last): a jax.profiler trace of those steps in WORKDIR/plugins/profile/ (process 0).
  # CPU devices of a single process (no accelerator): "auto" is JAX's own (one, XLA splitting each op over the
  # cores) | "N" simulated devices. --cpu_devices N (or JAXDP_CPU_DEVICES) wins; jaxdp.launch: --devices_per_process.
  config.cpu_devices = "auto"

  config.parallel = ml_collections.ConfigDict()
  config.parallel.backend = "mesh"   # mesh: jit + shard_map over a 1-D Mesh('data'); pmap: jax.pmap.
  config.parallel.allreduce_dtype = "float32"  # Dtype of the gradient all-reduce; bfloat16 halves the bytes sent.
  config.parallel.shard_optimizer_state = False  # ZeRO-1 (mesh backend): optimizer state sharded over devices.
  config.parallel.shard_params = False  # FSDP (mesh backend): parameters, gradients, optimizer state sharded over devices.
  config.parallel.invariant = False  # Bitwise-identical results on any power-of-two device count (ordered gradient sum).
  config.parallel.invariant_shards = 8  # Invariant mode: fixed micro-shards of the global batch (a power of two >= devices).
  config.parallel.num_devices = 0    # Devices to use (single process only); 0 means all.
  config.parallel.prefetch = 2       # Transfers of train batches (k steps' each: jaxdp.feed) placed ahead of the step by a thread.

  config.task = ml_collections.ConfigDict()
  # classification | next_token | regression | "package.module:function_or_Class"; "": from the dataset (float
  # labels: regression, else classification). Other fields are the task's keyword arguments (docs/tasks.md), such
  # as classification's label_smoothing (train loss against smoothed labels; eval loss stays plain).
  config.task.name = ""

  config.model = ml_collections.ConfigDict()
  config.model.name = "cnn"          # mlp | cnn | "package.module:ClassName" (NNX or linen); other fields are kwargs.

  config.dataset = ml_collections.ConfigDict()
  config.dataset.name = "digits"     # TFDS name, "module:Class", ./folder, x.npz or token_file (docs/data.md).
  config.dataset.data_dir = config_dict.placeholder(str)  # TFDS data_dir; None means the TFDS default.
  config.dataset.builder_kwargs = ml_collections.ConfigDict()  # Keyword arguments of the TFDS builder (text_file: path, seq_len).
  config.dataset.train_split = "train"  # TFDS split spec, e.g. "train[:90%]".
  config.dataset.eval_split = "test"    # Evaluated exactly once per example.
  config.dataset.mean = ()           # Per-channel mean subtracted from inputs (uint8 images first scaled to [0, 1]); (): none.
  config.dataset.std = ()            # Per-channel std the inputs are divided by, after the mean; (): none.
  config.dataset.crop_padding = 0    # Train only: zero-pad images by this many pixels, then randomly crop back; 0: off.
  config.dataset.flip = False        # Train only: random horizontal flip.
  config.dataset.image_size = 0      # Images of varying size: train random-resized crop / eval central crop to this square; 0: off.
  config.dataset.skip_bad_examples = False  # An example that does not decode: False: one error naming it (exit 2); True: replaced by the next good one (train/skipped_examples); image folders leave such files out.
  # Datasets whose splits, decoded, fit in this many MiB are decoded once and held in memory (same batches, no decoding
  # per step); "auto": the smaller of 1024 and 1/16 of the machine's memory (data/dataset.py); 0: never. A number or "auto".
  config.dataset.cache_mb = config_dict.FieldReference("auto", field_type=object)
  return config
