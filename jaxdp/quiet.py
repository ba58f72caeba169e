"""TensorFlow's start-up lines off: imported first by jaxdp, since TensorFlow reads these when it loads.

TensorFlow (used for input only) prints lines at import on every command, before its log level is read:
TF_ENABLE_ONEDNN_OPTS=0 drops the oneDNN notice (oneDNN speeds up TensorFlow's own matmuls and
convolutions, which jaxdp does not run), TF_CPP_MIN_LOG_LEVEL=1 drops the other INFO lines; warnings and
errors still print. A value the user set wins.
"""

import os

os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
