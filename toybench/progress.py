"""A dependency-free progress bar on stderr for runs longer than a couple of seconds."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    """``Progress(total, label)``; ``update(done)`` with the absolute count; ``close()``.

    Draws nothing for the first ``delay`` seconds (short runs stay quiet), nothing when
    ``enabled`` is False, and only on a terminal unless ``force`` (logs and CI output stay
    clean). Redraws at most every 0.1 s."""

    def __init__(
        self,
        total: int,
        label: str,
        *,
        enabled: bool = True,
        delay: float = 2.0,
        stream: TextIO | None = None,
        force: bool = False,
    ):
        self.total = max(1, total)
        self.label = label
        self.stream = stream or sys.stderr
        self.enabled = enabled and (force or getattr(self.stream, "isatty", lambda: False)())
        self.delay = delay
        self.t0 = time.perf_counter()
        self.last = 0.0
        self.drawn = False
        self.done = 0

    def update(self, done: int) -> None:
        self.done = min(done, self.total)
        if not self.enabled:
            return
        now = time.perf_counter()
        if now - self.t0 < self.delay or (now - self.last < 0.1 and self.done < self.total):
            return
        self.last = now
        frac = self.done / self.total
        width = 30
        bar = "#" * int(frac * width) + "-" * (width - int(frac * width))
        elapsed = now - self.t0
        eta = f", ~{elapsed / frac - elapsed:.0f} s left" if 0 < frac < 1 else ""
        self.stream.write(f"\r{self.label} [{bar}] {frac:4.0%} {elapsed:.0f} s{eta}   ")
        self.stream.flush()
        self.drawn = True

    def close(self) -> None:
        if self.drawn:
            self.update(self.done)
            self.stream.write("\n")
            self.stream.flush()
