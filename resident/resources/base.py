"""The resource interface the scheduler drives."""

from __future__ import annotations


class Resource:
    """A per-request resource. `admit` reserves what `num_new` more tokens need, or returns why
    it cannot; `commit` records them once the step ran; `free` returns everything."""

    name = "resource"

    def admit(self, request_id: str, num_new: int) -> str | None:
        raise NotImplementedError

    def commit(self, request_id: str, num_new: int) -> None:
        raise NotImplementedError

    def free(self, request_id: str) -> None:
        raise NotImplementedError
