"""A GPT-style byte-level language model on any local UTF-8 text file (offline): the `text_file` dataset.

    python -m jaxdp.train --config jaxdp/configs/gpt_text_file.py --workdir /tmp/gpt \
        --config.dataset.builder_kwargs.path=book.txt

The loss is in nats per token, i.e. per character for ASCII text (tokens are bytes).
"""

import ml_collections
from ml_collections import config_dict

from jaxdp.configs import default


def get_config() -> ml_collections.ConfigDict:
  """Default config with a 4-layer, 128-wide GPT over byte windows of a text file."""
  config = default.get_config()
  config.batch_size = 32             # Sequences per step: 32 x 128 = 4096 tokens.
  config.eval_batch_size = 256
  config.num_train_steps = 2000
  config.optimizer = "adamw"
  config.learning_rate = 2e-3
  config.weight_decay = 0.1          # GPT-2 recipe: on matrices (and embeddings) only ...
  config.weight_decay_mask = "rank>=2"  # ... not on biases and LayerNorm scales.
  config.max_grad_norm = 1.0         # Clip the global gradient norm to 1.
  config.lr_schedule = "cosine"
  config.warmup_steps = 50
  config.log_every_steps = 25
  config.eval_every_steps = 250

  config.task.name = "next_token"    # Per-token cross-entropy and accuracy, and bits per byte.
  config.model.name = "gpt"
  config.model.num_layers = 4        # Transformer blocks.
  config.model.num_heads = 4         # Attention heads per block (embed_dim must be divisible by it).
  config.model.embed_dim = 128       # Width of the residual stream.
  config.model.mlp_ratio = 4         # Hidden width of each block's MLP, in multiples of embed_dim.
  config.model.positions = "rotary"  # learned | rotary position information.

  config.dataset.name = "text_file"
  config.dataset.builder_kwargs.path = config_dict.placeholder(str)  # The UTF-8 text file (required).
  config.dataset.builder_kwargs.seq_len = 128      # Tokens per example: the model's context.
  config.dataset.builder_kwargs.stride = 64        # Train windows start every 64 bytes (overlap: more examples).
  config.dataset.builder_kwargs.test_fraction = 0.1  # The last 10% of the file is the `test` split.
  return config
