"""The engine core's side of its API processes: one output pipe each, and which process owns
each request, so a step's outputs go out as one message a process (its streams' outputs only).

With `stream_interval` n > 1 a request's plain outputs (types.is_plain) after its first are
held back until n tokens are, and go as one output; any other output (its last, an error)
takes what is held with it; an aborted request's held tokens are dropped with it.

A process that died (ApiGone) gets nothing more and its requests are returned for aborting.
Every live process hears from the core at least every `heartbeat_s` (serve.py tells a stuck
core from a quiet one by it).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import zmq

from resident.engine.types import RequestOutput, is_plain
from resident.server.protocol import Heartbeat, StepOutputs


class OutputRouter:
    def __init__(self, context: zmq.Context, output_addrs: Sequence[str],
                 heartbeat_s: float, stream_interval: int = 1) -> None:
        self._sockets: list[zmq.Socket | None] = []
        for addr in output_addrs:
            socket = context.socket(zmq.PUSH)
            socket.connect(addr)
            self._sockets.append(socket)
        self._owners: dict[str, int] = {}  # request id -> API index
        self._stream_interval = stream_interval
        # request id -> its tokens held back (stream_interval), [] once its first output went
        self._held: dict[str, list[int]] = {}
        self._last_sent = [time.monotonic()] * len(output_addrs)
        self._heartbeat_s = heartbeat_s

    @property
    def num_live(self) -> int:
        return sum(socket is not None for socket in self._sockets)

    def own(self, request_id: str, api_index: int) -> None:
        self._owners[request_id] = api_index

    def disown(self, request_id: str) -> None:
        """An aborted request: the engine sends no output for it."""
        self._owners.pop(request_id, None)
        self._held.pop(request_id, None)

    def send(self, api_index: int, message) -> None:
        """`message` to one API process (nothing if it is gone or unknown)."""
        socket = self._sockets[api_index] if 0 <= api_index < len(self._sockets) else None
        if socket is not None:
            socket.send_pyobj(message)
            self._last_sent[api_index] = time.monotonic()

    def broadcast(self, message) -> None:
        for api_index in range(len(self._sockets)):
            self.send(api_index, message)

    def send_outputs(self, outputs: list[RequestOutput]) -> None:
        """A step's outputs: one StepOutputs to each process that owns any of them."""
        by_owner: dict[int, StepOutputs] = {}
        for output in outputs:
            owner = (self._owners.pop(output.request_id, None) if output.finished
                     else self._owners.get(output.request_id))
            if owner is None:  # its process is gone
                continue
            if self._stream_interval > 1:
                output = self._held_back(output)
                if output is None:
                    continue
            owned = by_owner.get(owner)
            if owned is None:
                owned = by_owner[owner] = StepOutputs.of(())
            owned.add(output)
        for api_index, owned in by_owner.items():
            self.send(api_index, owned)

    def _held_back(self, output: RequestOutput) -> RequestOutput | None:
        """What of `output` goes now under stream_interval (None: it is held)."""
        request_id = output.request_id
        held = self._held.get(request_id)
        if held is None:  # its first output goes at once
            if not output.finished:
                self._held[request_id] = []
            return output
        # it takes what is held with it (a request that asked for logprobs has no plain
        # output: nothing of it is held, and its tokens and logprobs stay one for one)
        if output.finished or not is_plain(output):
            if output.finished:
                del self._held[request_id]
            else:
                self._held[request_id] = []
            return output._replace(new_token_ids=held + output.new_token_ids) if held else output
        held.extend(output.new_token_ids)
        if len(held) < self._stream_interval:
            return None
        self._held[request_id] = []
        return output._replace(new_token_ids=held)

    def heartbeat(self) -> None:
        """A Heartbeat to each live process that has heard nothing for heartbeat_s."""
        now = time.monotonic()
        for api_index, last in enumerate(self._last_sent):
            if now - last >= self._heartbeat_s:
                self.send(api_index, Heartbeat())

    def gone(self, api_index: int) -> list[str]:
        """Forgets a dead API process; returns the requests it owned (to abort)."""
        if not 0 <= api_index < len(self._sockets) or self._sockets[api_index] is None:
            return []
        self._sockets[api_index].close(linger=0)
        self._sockets[api_index] = None
        owned = [rid for rid, owner in self._owners.items() if owner == api_index]
        for request_id in owned:
            del self._owners[request_id]
            self._held.pop(request_id, None)
        return owned

    def close(self, linger_ms: int) -> None:
        for socket in self._sockets:
            if socket is not None:
                socket.close(linger=linger_ms)
