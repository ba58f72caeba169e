"""A GPT over a token file of any size (`token_file`: a flat uint16/uint32 array, as nanoGPT's train.bin).

    python -m jaxdp.datasets.token_file book.txt book.bin        # or your tokenizer + token_file.Writer
    python -m jaxdp.train --config jaxdp/configs/gpt_token_file.py --workdir /tmp/gpt \
        --config.dataset.builder_kwargs.path=book.bin

The file is memory-mapped and read by window index: memory does not grow with the corpus. The model's
vocabulary is the file's (its sidecar PATH.json, or builder_kwargs.vocab_size).
"""

import ml_collections
from ml_collections import config_dict

from jaxdp.configs import gpt_text_file


def get_config() -> ml_collections.ConfigDict:
  """gpt_text_file's model and optimizer over windows of a token file."""
  config = gpt_text_file.get_config()
  config.dataset.name = "token_file"
  config.dataset.builder_kwargs = ml_collections.ConfigDict()
  config.dataset.builder_kwargs.path = config_dict.placeholder(str)       # The token file (required): train.bin.
  config.dataset.builder_kwargs.eval_path = config_dict.placeholder(str)  # A second file for `test` (val.bin) ...
  config.dataset.builder_kwargs.test_fraction = 0.1  # ... else the last 10% of `path`'s tokens is `test`.
  config.dataset.builder_kwargs.seq_len = 256        # Tokens per example: the model's context.
  config.dataset.builder_kwargs.stride = 0           # Train windows start every `stride` tokens; 0: seq_len.
  config.dataset.builder_kwargs.dtype = config_dict.placeholder(str)      # uint16 | uint32; None: sidecar, else uint16.
  config.dataset.builder_kwargs.vocab_size = config_dict.placeholder(int)  # None: from the sidecar.
  return config
