"""Converts a TFDS dataset prepared as TFRecord to ArrayRecord in place, so jaxdp can read it by index.

    python -m jaxdp.data.convert DATA_DIR/NAME[/CONFIG]/VERSION

Each TFRecord shard is copied record by record to an ArrayRecord shard beside it (`group_size:1`, as TFDS writes
it); `dataset_info.json` then names ArrayRecord as the file format. The TFRecord shards stay, unused. No Apache Beam.
"""

import glob
import json
import os
import sys

from array_record.python import array_record_module

from jaxdp.data import reader

ARRAY_RECORD = "array_record"


def convert(version_dir: str) -> list[str]:
  """Writes an ArrayRecord copy of every TFRecord shard in `version_dir`; returns the shards written."""
  tf = reader.tensorflow()
  info_path = os.path.join(version_dir, "dataset_info.json")
  if not os.path.isfile(info_path):
    raise FileNotFoundError(f"{version_dir!r} is not a prepared TFDS dataset version (no dataset_info.json)")
  written = []
  for shard in sorted(glob.glob(os.path.join(version_dir, "*.tfrecord-*-of-*"))):
    target = shard.replace(".tfrecord-", f".{ARRAY_RECORD}-")
    partial = target + ".incomplete"  # Renamed when complete: an interrupted run never leaves a short shard.
    writer = array_record_module.ArrayRecordWriter(partial, "group_size:1")
    for record in tf.data.TFRecordDataset(shard).as_numpy_iterator():
      writer.write(record)
    writer.close()
    os.replace(partial, target)
    written.append(target)
  with open(info_path) as f:
    info = json.load(f)
  if written and info.get("fileFormat") != ARRAY_RECORD:
    info["fileFormat"] = ARRAY_RECORD
    with open(info_path + ".tmp", "w") as f:
      json.dump(info, f, indent=2)
    os.replace(info_path + ".tmp", info_path)
  return written


def main(argv: list[str]) -> int:
  """0: converted; 2: bad usage or not a TFRecord-prepared dataset (one `error:` line)."""
  usage = __doc__.strip().splitlines()[2].strip()
  if len(argv) == 2 and argv[1] in ("-h", "--help"):
    print(f"usage: {usage}\n\n{__doc__}")
    return 0
  if len(argv) != 2:
    print(f"error: expected one dataset directory (usage: {usage})", file=sys.stderr)
    return 2
  try:
    shards = convert(argv[1])
  except FileNotFoundError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  print(f"wrote {len(shards)} ArrayRecord shard(s) in {argv[1]}")
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv))
