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

    # -- resident hooks: a resource that keeps its part of the planner's row says so ----------

    def resident_refusal(self) -> str | None:
        """Why this resource cannot keep a resident table (None: it can). The base refuses, so
        a new resource stays host-planned until it has one."""
        return f"resource {self.name!r} keeps no resident table"
