"""How a decode step's per-row inputs reach the device: one interface, two implementations.

- `HostPlanning` (`resident_planning: off`): every decode step stages each row's position, KV
  write location, block-table row and GDN slot on the host and uploads them (inputs.py).
- `ResidentPlanning` (`auto`, resident_planning.py): the resident planner keeps each request's
  row on the device; a step sends only what changed, and the bucket's graph gathers its rows
  and advances their lengths itself.

The engine drives either through the same calls: `prepare_decode` (what can be done before the
step's token ids are known: under `plan_ahead` it runs while the step before runs),
`upload_decode` (the ids and any host attention plan, at launch), the forward between
`before_forward` and `after_forward` (recorded in each decode bucket's graph), then `commit`
after the step and `release` when a request finishes or is offloaded. Prefill and mixed steps
are host-planned in both modes (inputs.py); resident planning marks their rows stale.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from resident.config import EngineConfig
from resident.engine.buffers import SampledTokens
from resident.engine.inputs import StepInputs
from resident.engine.sampler import StepLogits
from resident.engine.scheduler import StepPlan
from resident.planner import ResidentPlan, StagedStep
from resident.resources.base import Resource


@dataclass
class PreparedStep:
    """A step staged as far as it goes before its token ids are known. A decode step is staged
    when prepared; a varlen (prefill or mixed) step stages at launch."""

    plan: StepPlan
    bucket: int = 0  # a decode step's bucket; 0 for a varlen step
    width: int = 1  # block-table columns its rows use
    resident: ResidentPlan | None = None  # a resident step's plan
    staged: StagedStep | None = None  # and what its flush sent
    logits: StepLogits | None = None  # once launched
    launched_s: float = 0.0  # perf_counter when its launch returned (launch_window.py)

    @property
    def is_decode(self) -> bool:
        return self.plan.kind == "decode"


class StepPlanning(ABC):
    """The planning mode of a node's decode steps (module docstring)."""

    mode: str  # "off" or "resident", as /debug/config reports it
    reason: str  # why this mode: the planner's description, or why it stayed off

    @abstractmethod
    def prepare_decode(self, plan: StepPlan) -> PreparedStep:
        """Stages a decode step but its token ids, which may not be read back yet."""

    @abstractmethod
    def upload_decode(self, prepared: PreparedStep, sampled: SampledTokens | None) -> None:
        """The step's token ids (from the host, or from `sampled` on the device) and the
        attention backend's host plan, if it needs one."""

    def before_forward(self, bucket: int, width: int) -> None:
        """Device work before a decode bucket's forward, recorded in its graph."""
        del bucket, width

    def after_forward(self, bucket: int) -> None:
        """Device work after it, recorded in its graph."""
        del bucket

    def stage_idle(self, bucket: int) -> None:
        """What an all-padding step of the bucket needs besides the inputs, for a capture."""
        del bucket

    def capture_width(self, max_pages: int) -> int:
        """Block-table columns a captured decode bucket reads (its rows may hold up to this)."""
        return max_pages

    def commit(self, prepared: PreparedStep) -> None:
        """After the step launched: what planning keeps in step with the streams."""
        del prepared

    def release(self, request_id: str, offload: bool = False) -> None:
        """A request finished, was aborted or offloaded."""
        del request_id, offload

    def counters(self) -> dict[str, Any]:
        """The planner's and row check's counters (/debug/rowcheck); empty when host-planned."""
        return {}


def planner_refusal(config: EngineConfig, resources: Iterable[Resource]) -> str | None:
    """Why the resident planner stays off on this node (None: it turns on)."""
    if config.resident_planning == "off":
        return "resident_planning=off: every step is host-planned"
    for resource in resources:
        reason = resource.resident_refusal()
        if reason:
            return f"{reason}: every step is host-planned"
    return None


class HostPlanning(StepPlanning):
    mode = "off"

    def __init__(self, inputs: StepInputs, reason: str) -> None:
        self.inputs, self.reason = inputs, reason

    def prepare_decode(self, plan: StepPlan) -> PreparedStep:
        bucket = self.inputs.bucket_for(len(plan.rows))
        width = self.inputs.stage_decode(plan, bucket)
        self.inputs.upload_decode(bucket)
        return PreparedStep(plan, bucket, width)

    def upload_decode(self, prepared: PreparedStep, sampled: SampledTokens | None) -> None:
        self.inputs.upload_ids(prepared.plan, prepared.bucket, sampled)
        self.inputs.plan_attention(prepared.plan, prepared.bucket, prepared.width)
