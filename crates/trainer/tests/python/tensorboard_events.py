"""A run's TensorBoard events as TensorBoard reads them: every scalar of every event file in
RUN_DIR/tensorboard, through the `tensorboard` package's own event file loader (which checks each
record's CRC and turns scalars into the 0-d tensors TensorBoard keeps), for
crates/trainer/tests/tensorboard.rs.

Usage: tensorboard_events.py RUN_DIR OUT_JSON
OUT_JSON gets {"files": n, "file_version": [...], "starts": [steps of SessionLog START],
"scalars": [[tag, step, value], ...]} in file order.
"""

import json
import os
import sys

from tensorboard.backend.event_processing import event_file_loader
from tensorboard.util import tensor_util


def main():
    run, out = sys.argv[1], sys.argv[2]
    folder = os.path.join(run, "tensorboard")
    names = sorted(n for n in os.listdir(folder) if n.startswith("events.out.tfevents."))
    found = {"files": len(names), "file_version": [], "starts": [], "scalars": []}
    for name in names:
        for event in event_file_loader.EventFileLoader(os.path.join(folder, name)).Load():
            if event.file_version:
                found["file_version"].append(event.file_version)
            if event.HasField("session_log"):
                found["starts"].append(event.step)
            for value in event.summary.value:
                # The loader hands scalars over as TensorBoard stores them now: 0-d tensors.
                if value.WhichOneof("value") == "simple_value":
                    number = value.simple_value
                else:
                    number = float(tensor_util.make_ndarray(value.tensor))
                found["scalars"].append([value.tag, event.step, number])
    with open(out, "w") as f:
        json.dump(found, f)


if __name__ == "__main__":
    main()
