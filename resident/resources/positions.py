"""Positions: a request's token at stream index i sits at position offset + i.

For Qwen3.5 text the offset is 0; the resource owns it so a row's position cell has an owner.
"""

from __future__ import annotations

from resident.resources.base import Resource


class Positions(Resource):
    name = "positions"

    def __init__(self) -> None:
        self.offsets: dict[str, int] = {}

    def admit(self, request_id: str, num_new: int, offset: int = 0) -> str | None:
        """A new request's positions start at `offset` (0 for Qwen3.5 text)."""
        self.offsets.setdefault(request_id, offset)
        return None

    def commit(self, request_id: str, num_new: int) -> None:
        """Positions follow the KV stream's length; nothing advances here."""

    def free(self, request_id: str) -> None:
        self.offsets.pop(request_id, None)

    def resident_refusal(self) -> str | None:
        return None  # the position offset cell, against the KV pool's stored length

    def position(self, request_id: str, index: int) -> int:
        return self.offsets[request_id] + index
