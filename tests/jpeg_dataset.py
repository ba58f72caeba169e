"""`varsize_jpegs`: a tiny `synthetic_jpegs` (jaxdp.datasets.synthetic_jpegs) for the image tests, prepared offline.

64 train and 20 test JPEGs of 24..64 x 24..64 pixels, 4 classes. Importing this module registers the builder.
"""

from jaxdp.datasets import synthetic_jpegs


class VarsizeJpegs(synthetic_jpegs.SyntheticJpegs):
  """The image tests' size: small enough to prepare in a second, sizes varying enough to need crops."""

  def __init__(self, **kwargs):
    super().__init__(num_train=64, num_test=20, num_classes=4, height=(24, 64), width=(24, 64), **kwargs)
