"""A subscriber process for the events tests: prints each event as a JSON line, exits after N.

Usage: python -m tests.procs.subscriber BOOTSTRAP PREFIX GROUP_ID JOB_ID MAX_EVENTS
"""

from __future__ import annotations

import dataclasses
import json
import sys

from chandy.coordinator.kafka.subscriber import subscribe


def main() -> None:
    bootstrap, prefix, group_id, job_id, max_events = sys.argv[1:6]
    seen = 0
    with subscribe(bootstrap, job_id=job_id, start="committed", group_id=group_id, prefix=prefix) as subscription:
        print(json.dumps({"ready": True}), flush=True)
        for event in subscription:
            print(json.dumps(dataclasses.asdict(event)), flush=True)
            seen += 1
            if seen >= int(max_events):
                break


if __name__ == "__main__":
    main()
