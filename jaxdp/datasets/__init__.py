"""TFDS builders shipped with jaxdp; importing this package registers them with TFDS, and the kinds of a user's
own data (an .npz file, an image folder: `user`) with `jaxdp.data.kinds`."""

from jaxdp.datasets import digits  # noqa: F401  (registers "digits")
from jaxdp.datasets import synthetic_images  # noqa: F401  (registers "synthetic_jpegs")
from jaxdp.datasets import text_file  # noqa: F401  (registers "text_file")
from jaxdp.datasets import tiny_shakespeare_chars  # noqa: F401  (registers "tiny_shakespeare_chars")
from jaxdp.datasets import user  # noqa: F401  (registers the .npz and image-folder kinds)
