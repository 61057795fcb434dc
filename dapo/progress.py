"""A dependency-free progress bar on stderr for runs longer than a couple of seconds: the
toy runs, ``dapo train`` and ``dapo eval`` share it, so that a redirected log gets plain
lines and never a carriage-return frame."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    """``Progress(total, label)``; ``update(done, status)`` with the absolute count and an
    optional short status (``acc=0.41 ent=0.32``); ``close()``, or ``with Progress(...) as bar:``
    (closed however the block ends: an interrupt's message then starts on a line of its own).
    ``start`` is where a resumed run begins: the time left is estimated from the work done since.

    Draws nothing for the first ``delay`` seconds (short runs stay quiet) and nothing when
    ``enabled`` is False. On a terminal (or with ``force``) it redraws one bar at most every
    0.1 s; elsewhere (CI logs, ``nox``) it writes a plain line every ``log_every`` seconds, so
    that a long run is never silent and a log never fills with carriage returns. ``plain``:
    those lines even on a terminal, never a bar (a ``--quiet`` command's sign of life)."""

    def __init__(
        self,
        total: int,
        label: str,
        *,
        enabled: bool = True,
        delay: float = 2.0,
        stream: TextIO | None = None,
        force: bool = False,
        log_every: float = 30.0,
        start: int = 0,
        plain: bool = False,
    ):
        self.total = max(1, total)
        self.start = min(max(0, start), self.total)
        self.status = ""
        self.label = label
        self.stream = stream or sys.stderr
        self.tty = not plain and (force or getattr(self.stream, "isatty", lambda: False)())
        self.enabled = enabled
        self.delay = delay if self.tty else max(delay, log_every / 3)
        self.log_every = log_every
        self.t0 = time.perf_counter()
        self.last = 0.0
        self.drawn = False
        self.shown: tuple[int, str] | None = None
        """(done, status) of the bar on screen."""
        self.done = self.start

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _eta(self, elapsed: float) -> str:
        worked = (self.done - self.start) / self.total
        left = (self.total - self.done) / self.total
        return f", ~{elapsed / worked * left:.0f} s left" if worked > 0 and left > 0 else ""

    def _status(self) -> str:
        return f" {self.status}" if self.status else ""

    def update(self, done: int, status: str = "") -> None:
        self.done = min(done, self.total)
        self.status = status
        if not self.enabled:
            return
        now = time.perf_counter()
        if now - self.t0 < self.delay:
            return
        if not self.tty:
            if now - self.last >= self.log_every and self.done < self.total:
                self.last = now
                elapsed = now - self.t0
                frac = self.done / self.total
                self.stream.write(
                    f"{self.label}: {frac:.0%} ({self.done}/{self.total}) after {elapsed:.0f} s"
                    f"{self._eta(elapsed)}{self._status()}\n"
                )
                self.stream.flush()
            return
        if now - self.last < 0.1 and self.done < self.total:
            return
        self.last = now
        frac = self.done / self.total
        width = 30
        bar = "#" * int(frac * width) + "-" * (width - int(frac * width))
        elapsed = now - self.t0
        self.stream.write(
            f"\r{self.label} [{bar}] {frac:4.0%} {self.done}/{self.total} {elapsed:.0f} s"
            f"{self._eta(elapsed)}{self._status()}   "
        )
        self.stream.flush()
        self.drawn = True
        self.shown = (self.done, self.status)

    def clear(self) -> None:
        """Erase a bar drawn on a terminal, so that a line printed next starts clean (the next
        update draws the bar again)."""
        if self.drawn and self.tty and self.enabled:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self.shown = None

    def close(self) -> None:
        """End a bar drawn on a terminal: its last state (drawn again only if it changed since)
        and a newline."""
        if self.drawn and self.tty:
            if self.shown != (self.done, self.status):
                self.update(self.done, self.status)
            self.stream.write("\n")
            self.stream.flush()
