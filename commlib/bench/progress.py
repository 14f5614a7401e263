"""A one-line text progress bar on stderr (rank 0 only), redrawn in place with a carriage return."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class ProgressBar:
    """Call with (done, total) after each step; :meth:`finish` clears the line."""

    def __init__(self, label: str, stream: TextIO | None = None, width: int = 30):
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.width = width
        self.start = time.monotonic()

    def __call__(self, done: int, total: int) -> None:
        filled = self.width * done // max(total, 1)
        elapsed = time.monotonic() - self.start
        eta = elapsed / done * (total - done) if done else 0.0
        self.stream.write(f"\r{self.label} [{'#' * filled}{'.' * (self.width - filled)}] {done}/{total} "
                          f"{elapsed:5.0f}s elapsed, ~{eta:.0f}s left ")
        self.stream.flush()

    def finish(self) -> None:
        self.stream.write("\r" + " " * (len(self.label) + self.width + 48) + "\r")
        self.stream.flush()


def wanted(flag: bool | None, stream: TextIO | None = None) -> bool:
    """--progress / --no-progress decide; without either, show it only when stderr is a terminal."""
    if flag is not None:
        return flag
    stream = stream if stream is not None else sys.stderr
    return bool(getattr(stream, "isatty", lambda: False)())
