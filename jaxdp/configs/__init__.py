"""Ready configs: each file has `get_config()`; pass its path to `--config`."""
