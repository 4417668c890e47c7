"""A coordinator process for the kill tests: runs periodic checkpoints until killed.

Usage: python -m tests.procs.run_coordinator BOOTSTRAP JOB_ID PREFIX CHECKPOINT_DIR INTERVAL_MS OPERATOR=N...
Prints one JSON line when started.
"""

from __future__ import annotations

import json
import sys
import time

from chandy.coordinator.kafka.runtime import CoordinatorService
from chandy.coordinator.options import CheckpointingOptions
from tests.procs.common import RecordingHook


def main() -> None:
    bootstrap, job_id, prefix, checkpoint_dir, interval = sys.argv[1:6]
    operators = {k: int(v) for k, v in (a.split("=") for a in sys.argv[6:])}
    service = CoordinatorService(
        job_id, bootstrap,
        CheckpointingOptions(interval_ms=int(interval), timeout_ms=600_000, checkpoint_dir=checkpoint_dir,
                             random_initial_delay=False, max_concurrent=1),
        operators, master_hooks=[RecordingHook()], prefix=prefix,
    ).start()
    print(json.dumps({"started": True, "epoch": service.epoch}), flush=True)
    while not service.stopped.is_set():
        time.sleep(0.2)


if __name__ == "__main__":
    main()
