"""An MLP on `digits`: the smallest config, for quick checks."""

import ml_collections

from jaxdp.configs import default


def get_config() -> ml_collections.ConfigDict:
  """Default config with the built-in MLP."""
  config = default.get_config()
  config.model.name = "mlp"
  config.model.hidden = (256, 256)   # Hidden layer widths.
  return config
