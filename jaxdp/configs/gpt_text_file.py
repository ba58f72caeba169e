"""A GPT-style byte-level language model on any local UTF-8 text file (offline): the `text_file` dataset.

    python -m jaxdp.train --config jaxdp/configs/gpt_text_file.py --workdir /tmp/gpt \
        --config.dataset.builder_kwargs.path=book.txt

The loss is in nats per token, i.e. per character for ASCII text (tokens are bytes). The recipe (AdamW, decay,
clipping, cosine schedule, next-token task) is `gpt_tiny_shakespeare`'s, at a smaller size.
"""

import ml_collections
from ml_collections import config_dict

from jaxdp.configs import gpt_tiny_shakespeare


def get_config() -> ml_collections.ConfigDict:
  """`gpt_tiny_shakespeare`'s recipe with a 4-layer, 128-wide GPT over byte windows of a text file."""
  config = gpt_tiny_shakespeare.get_config()
  config.batch_size, config.eval_batch_size = 32, 256  # Sequences per step: 32 x 128 = 4096 tokens.
  config.num_train_steps, config.learning_rate, config.warmup_steps = 2000, 2e-3, 50
  config.log_every_steps, config.eval_every_steps = 25, 250
  config.model.update(num_layers=4, num_heads=4, embed_dim=128, positions="rotary")
  config.dataset.name = "text_file"
  config.dataset.eval_split = "test"
  config.dataset.builder_kwargs.path = config_dict.placeholder(str)  # The UTF-8 text file (required).
  config.dataset.builder_kwargs.seq_len = 128      # Tokens per example: the model's context.
  config.dataset.builder_kwargs.stride = 64        # Train windows start every 64 bytes (overlap: more examples).
  config.dataset.builder_kwargs.test_fraction = 0.1  # The last 10% of the file is the `test` split.
  return config
