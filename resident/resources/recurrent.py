"""StatePool: GDN state slots (conv and recurrent state of every GDN layer), slot 0 the sink."""

from __future__ import annotations

from resident.resources.base import Resource

SINK_SLOT = 0


class StatePool(Resource):
    name = "gdn"

    def __init__(self, num_slots: int) -> None:
        self.num_slots = num_slots
        self._free = list(range(num_slots - 1, SINK_SLOT, -1))
        self.slots: dict[str, int] = {}

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return len(self.slots)

    def admit(self, request_id: str, num_new: int) -> str | None:
        if request_id in self.slots:
            return None
        if not self._free:
            return "no free GDN state slot"
        self.slots[request_id] = self._free.pop()
        return None

    def resident_refusal(self) -> str | None:
        return None  # the GDN slot cell

    def is_held(self, request_id: str) -> bool:
        return request_id in self.slots

    def commit(self, request_id: str, num_new: int) -> None:
        """The state advances in place on the device; nothing to record on the host."""

    def free(self, request_id: str) -> int | None:
        slot = self.slots.pop(request_id, None)
        if slot is not None:
            self._free.append(slot)
        return slot
