"""The mailbox's timers do not pile up: a checkpoint's timeout is cancelled when it completes,
long before it is due, and the cancelled timers are swept out of the heap (found by the soak,
benchmarks/soak_checkpoints.py: +20 % RSS over 10,000 checkpoints at a 10 min timeout); timers
still due fire, and a live one survives every sweep."""

from __future__ import annotations

import threading

from chandy.coordinator.environment import Mailbox


def test_cancelled_timers_are_swept_and_live_ones_kept() -> None:
    mailbox = Mailbox("test-mailbox")
    mailbox.start()
    try:
        fired = threading.Event()
        kept = mailbox.schedule(600_000, lambda: None)  # a live timer far in the future
        peak = 0
        for _ in range(10_000):  # one checkpoint timeout each, cancelled at once
            mailbox.schedule(600_000, lambda: None).cancel()
            peak = max(peak, len(mailbox._timers))
        assert peak <= 130, peak  # without the sweep: 10,001
        assert any(entry[3] is kept for entry in mailbox._timers)
        mailbox.schedule(10, fired.set)
        assert fired.wait(5)
    finally:
        mailbox.close()
