"""A background loop that calls poll() every interval_s: the /metrics sampler of task 7, the
dashboard's monitor and the lab's memory sampler are all one of these."""
from __future__ import annotations

import threading


class Poller:
    """poll() every interval_s in a daemon thread, from start() (or `with`) until stop()."""

    def __init__(self, interval_s: float):
        self.interval_s = interval_s
        self.last_error: str | None = None   # an unexpected failure of poll(), kept, not raised
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def poll(self) -> None:
        raise NotImplementedError

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.poll()
            except Exception as e:  # noqa: BLE001 - one bad sample must not end the loop
                self.last_error = f"{type(e).__name__}: {e}"
            self._stop.wait(self.interval_s)

    def start(self):
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
