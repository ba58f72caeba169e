"""An MLP on `digits`: the smallest config, for quick checks."""

import ml_collections

from jaxdp.configs import default


def get_config() -> ml_collections.ConfigDict:
  """Default config with the built-in MLP."""
  config = default.get_config()
  config.model.name = "mlp"
  config.model.hidden = (256, 256)   # Hidden layer widths.
  # One CPU device: XLA's threads already split a dense MLP's matmuls, and one device per core adds an all-reduce
  # and an optimizer update per device. Why: docs/design-notes.md#cpu-devices
  config.cpu_devices = "1"
  return config
