"""TensorFlow, as jaxdp loads it (`tensorflow()`): it only feeds the input pipeline, so it never takes accelerator
memory, and its start-up lines are off. The pipeline calls it where it first needs TensorFlow, never at import
(TensorFlow takes seconds to import; a process that never decodes nor shuffles does not pay it), and before any
TFDS call that loads TensorFlow itself (preparing, `as_dataset`).
"""

import functools
import logging
import os
import sys
import types

from jaxdp.runtime import quiet


@functools.cache
def tensorflow() -> types.ModuleType:
  """TensorFlow with no GPU or TPU visible to it and its Python log at ERROR, imported (once) if not loaded yet."""
  if "tensorflow" not in sys.modules:
    for name, value in quiet.TF_ENV.items():  # A value already set wins (JAX's import sets the log level).
      os.environ.setdefault(name, value)
  import tensorflow as tf  # The one import of TensorFlow in jaxdp.
  try:
    for kind in ("GPU", "TPU"):
      tf.config.set_visible_devices([], kind)
  except RuntimeError:  # The user's own TensorFlow ran ops before jaxdp's first use: its devices are fixed.
    logging.getLogger("jaxdp").warning("TensorFlow set its devices before jaxdp's input pipeline used it, and may "
                                       "hold accelerator memory: call tf.config.set_visible_devices([], 'GPU') "
                                       "before TensorFlow's first op")
  tf.get_logger().setLevel(logging.ERROR)
  return tf
