"""A GPT-style character-level language model on TFDS `tiny_shakespeare` (about 1 MB of Shakespeare).

Read through `tiny_shakespeare_chars`, which cuts the text into supervised windows (needs the TFDS
`tiny_shakespeare` download once). Model and recipe follow nanoGPT's shakespeare_char baseline, without dropout.
"""

import ml_collections

from jaxdp.configs import default


def get_config() -> ml_collections.ConfigDict:
  """Default config with a 6-layer, 384-wide GPT over 256-character windows of tiny_shakespeare."""
  config = default.get_config()
  config.batch_size = 64             # Sequences per step: 64 x 256 = 16384 tokens.
  config.eval_batch_size = 64
  config.num_train_steps = 5000
  config.optimizer = "adamw"
  config.learning_rate = 1e-3
  config.weight_decay = 0.1          # GPT-2 recipe: on matrices (and embeddings) only ...
  config.weight_decay_mask = "rank>=2"  # ... not on biases and LayerNorm scales.
  config.max_grad_norm = 1.0         # Clip the global gradient norm to 1.
  config.lr_schedule = "cosine"
  config.warmup_steps = 100
  config.log_every_steps = 50
  config.eval_every_steps = 500

  config.task.name = "next_token"    # Per-token cross-entropy and accuracy, and bits per byte.
  config.model.name = "gpt"
  config.model.num_layers = 6        # Transformer blocks.
  config.model.num_heads = 6         # Attention heads per block (embed_dim must be divisible by it).
  config.model.embed_dim = 384       # Width of the residual stream.
  config.model.mlp_ratio = 4         # Hidden width of each block's MLP, in multiples of embed_dim.
  config.model.positions = "learned"  # learned | rotary position information.

  config.dataset.name = "tiny_shakespeare_chars"
  config.dataset.builder_kwargs.seq_len = 256  # Characters per example: the model's context.
  config.dataset.builder_kwargs.stride = 64    # Train windows start every 64 characters (4x overlap).
  config.dataset.eval_split = "validation"     # tiny_shakespeare also has "test" (same size).
  return config
