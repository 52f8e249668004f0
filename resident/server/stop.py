"""Stop strings: a choice's text ends before the first stop string it produces (the first to be
complete; of two complete at the same character, the longer).

The text arrives in detokenized pieces, and a stop string may be split across them, so the
matcher holds back the longest tail of the text that could still begin a stop string and emits
it only once later text rules the match out (or the choice ends). Emitted text therefore never
holds any part of a stop string, and the concatenated output is the same however the text was
split.
"""

from __future__ import annotations


class StopStrings:
    """One choice's matcher over its text pieces."""

    def __init__(self, stops: tuple[str, ...]) -> None:
        if not stops or not all(stops):
            raise ValueError("stop strings must be non-empty")
        self.stops = stops
        self._longest = max(len(s) for s in stops)
        self._pending = ""  # held back: a tail that may begin a stop string

    def feed(self, text: str, final: bool) -> tuple[str, bool]:
        """The text that can be emitted now, and whether a stop string was found (the choice
        then ends; nothing after the stop string is emitted). `final`: the last piece, so
        nothing is held back."""
        buffer = self._pending + text
        # the stop string produced first: the earliest end, then (a longer one ending there) the
        # earliest start; so the cut does not depend on how the text was split into pieces
        found = [(i + len(stop), i) for stop in self.stops if (i := buffer.find(stop)) >= 0]
        if found:
            self._pending = ""
            return buffer[:min(found)[1]], True
        held = 0 if final else self._partial_tail(buffer)
        self._pending = buffer[len(buffer) - held:]
        return buffer[:len(buffer) - held], False

    def _partial_tail(self, buffer: str) -> int:
        """The length of the longest tail of `buffer` that is a proper prefix of a stop
        string (0 if none)."""
        for length in range(min(len(buffer), self._longest - 1), 0, -1):
            tail = buffer[-length:]
            if any(stop.startswith(tail) for stop in self.stops):
                return length
        return 0
