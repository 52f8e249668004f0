"""The torch references as a backend: every op on CPU, and decode attention anywhere."""

from __future__ import annotations

from resident.backends.base import DecodeKernels, PrefillKernels, PrefillStep
from resident.model.ops import ModelOps


class RefPrefill(PrefillKernels):
    def __init__(self, ops: ModelOps | None = None) -> None:
        self._ops = ops or ModelOps()

    def ops(self, step: PrefillStep) -> ModelOps:
        return self._ops


class RefDecode(DecodeKernels):
    """Reads the keys up to each token's position, the pages bounded on CPU by the step's
    furthest position (a host read) and elsewhere by the block-table width, so slow with the
    full-width tables a captured graph uses: it does not go into graphs."""

    name = "torch"

    def __init__(self, gdn: ModelOps | None = None) -> None:
        self._ops = gdn or ModelOps()

    def ops(self, bucket: int) -> ModelOps:
        return self._ops
