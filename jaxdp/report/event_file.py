"""A TensorBoard event file written with Python's own file I/O (TensorBoard's `DirectoryOutput` imports TensorFlow)."""

import os
import socket
import time

import numpy as np
from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.summary import Output
from tensorboard.summary.writer.record_writer import RecordWriter
from tensorboard.util import tensor_util


class EventFile(Output):
  """One new event file in `logdir`, each record written through at once (no queue, no thread)."""

  def __init__(self, logdir: str):
    os.makedirs(logdir, exist_ok=True)
    # TensorBoard's naming; the object id tells two writers of one process apart within a second.
    name = f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}.{id(self)}"
    self.path = os.path.join(logdir, name)
    self._records = RecordWriter(open(self.path, "wb"))
    self._write(event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2"))
    self.flush()

  def emit_scalar(self, *, plugin_name: str, tag: str, data: np.ndarray, step: np.ndarray, wall_time: float,
                  tag_metadata: bytes | None = None, description: str | None = None) -> None:
    """One scalar as an event, as TensorBoard's own `DirectoryOutput` writes it."""
    metadata = summary_pb2.SummaryMetadata(
        plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name=plugin_name, content=tag_metadata),
        summary_description=description, data_class=summary_pb2.DataClass.DATA_CLASS_SCALAR)
    event = event_pb2.Event(wall_time=wall_time, step=int(step))
    event.summary.value.add(tag=tag, tensor=tensor_util.make_tensor_proto(data), metadata=metadata)
    self._write(event)

  def flush(self) -> None:
    self._records.flush()

  def close(self) -> None:
    self._records.close()

  def _write(self, event: event_pb2.Event) -> None:
    self._records.write(event.SerializeToString())
