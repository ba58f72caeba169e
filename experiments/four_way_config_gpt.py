"""The four-way study's gpt workload as a config file for jaxdp's CLI (defined in four_way_configs.py:
the CLI reads a plain path, so one file per workload)."""

import four_way_configs
import ml_collections


def get_config() -> ml_collections.ConfigDict:
  """four_way_configs.get_config("gpt")."""
  return four_way_configs.get_config("gpt")
