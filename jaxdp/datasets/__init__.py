"""TFDS builders shipped with jaxdp; importing this package registers them with TFDS."""

from jaxdp.datasets import digits  # noqa: F401  (registers "digits")
