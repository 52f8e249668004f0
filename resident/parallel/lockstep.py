"""Lockstep: every rank runs the same scheduler on the same inputs, and proves it each step.

Rank 0 alone hears the API. At each step boundary it broadcasts one Beat: the engine inputs it
took since the last one (adds and aborts, in its order), whether to step, and the digest of its
last step. Every follower applies the same inputs in the same order and steps when told, so all
ranks see the same history at the same boundaries and their schedulers, planners and samplers
make the same choices; then it compares rank 0's digest of the last step with its own. A
mismatch raises LockstepError naming the step, and the follower exits, which rank 0 sees: a
clear failure, never a hang or a silent divergence. The digest covers what must agree: the
step's kind, each output (request, tokens, finished) and which requests hold planner slots
(request ids, not slot numbers: slot numbers are a rank's own, and no message or collective
ever carries one).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from resident.parallel.group import RankGroup


class LockstepError(RuntimeError):
    """A follower's step differs from rank 0's."""


@dataclass(frozen=True)
class Beat:
    """One step boundary, as rank 0 broadcasts it."""

    inputs: list[tuple[str, Any]] = field(default_factory=list)  # ("add", request) | ("abort", id)
    step: bool = False
    last_digest: str = ""  # rank 0's digest of the step before this beat ("" before any)
    steps: int = 0  # rank 0's steps before this beat
    stop: bool = False  # the server shuts down
    gather_rowcheck: bool = False  # every rank sends its row-check counts to rank 0 after it


def step_digest(kind: str | None, outputs: Iterable[Any], slot_holders: Iterable[str]) -> str:
    """16 hex digits over a step's kind, its outputs (request id, token ids, finished) and the
    requests that hold planner slots after it."""
    digest = hashlib.sha256(repr(kind).encode())
    for output in outputs:
        digest.update(f"{output.request_id}:{list(output.new_token_ids)}:{output.finished};"
                      .encode())
    digest.update(("|" + ",".join(sorted(slot_holders))).encode())
    return digest.hexdigest()[:16]


class Lockstep:
    """One rank's side of the beats: rank 0 sends them, followers receive and check them."""

    def __init__(self, group: RankGroup) -> None:
        self.group = group
        self.steps = 0
        self.digest = ""

    def send(self, beat: Beat) -> Beat:
        """Rank 0: broadcasts `beat` with its last step's digest filled in."""
        beat = Beat(beat.inputs, beat.step, self.digest, self.steps, beat.stop,
                    beat.gather_rowcheck)
        self.group.broadcast(beat)
        return beat

    def receive(self) -> Beat:
        """A follower: the next beat, once rank 0's last step is checked against ours."""
        beat = self.group.broadcast(None)
        if beat.steps != self.steps or beat.last_digest != self.digest:
            raise LockstepError(
                f"tensor-parallel rank {self.group.rank} left lockstep at step {self.steps}: "
                f"rank 0 has step {beat.steps} digest {beat.last_digest or '-'}, this rank "
                f"{self.digest or '-'} (the ranks' inputs or numerics differ)")
        return beat

    def stepped(self, digest: str) -> None:
        """This rank ran a step whose digest is `digest`."""
        self.steps += 1
        self.digest = digest
