"""The pipes between the API processes and the engine core: one Unix stream socket an API
process, both ways, each message pickled behind its 4-byte length (protocol.py's messages).

The API process listens on its pipe's path (`listen`, EngineClient) and the core connects
(`CorePipes`), so the core may start, and fail, after the API is listening. The core starts
before the other API processes: a path not bound yet is tried again at each turn of its loop,
and what the core sends that process meanwhile waits, in order. Neither end ever blocks on a
write: what the socket does not take stays in the `Pipe` and goes once the socket can take
more (the API's event loop or the core's poll says when).

Why not zmq's PUSH/PULL over ipc, which these replace: a zmq message crosses an I/O thread on
each side, two thread wake-ups where a socket has one. On an H100 host a zmq message reached a
process waiting in zmq's poll in 0.31 ms (p50), a Unix socket's reader in 0.06
(tests/gpu/host_probe.py, results/2026-12-06-h100-hit-path), and a request's first token
crosses two pipes (its add to the core, its token back).
"""

from __future__ import annotations

import contextlib
import pickle
import selectors
import socket
import struct
import time
from collections.abc import Sequence
from typing import Any

HEADER = struct.Struct("!I")  # a message's pickled length
SOCKET_BUFFER_BYTES = 4 << 20  # each direction's kernel buffer: a burst of outputs fits
RECV_BYTES = 1 << 20


def encode(message: Any) -> bytes:
    body = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return HEADER.pack(len(body)) + body


class Frames:
    """The messages in a byte stream, as its pieces arrive."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[Any]:
        """The messages `data` completes, in order; a partial one waits for the rest."""
        buffer = self._buffer
        buffer += data
        messages, start = [], 0
        while len(buffer) - start >= HEADER.size:
            (size,) = HEADER.unpack_from(buffer, start)
            end = start + HEADER.size + size
            if end > len(buffer):
                break
            messages.append(pickle.loads(buffer[start + HEADER.size:end]))
            start = end
        del buffer[:start]
        return messages


class Pipe:
    """One end of a connected pipe: writes that never block (what the socket does not take is
    kept for `flush`), reads split into messages. `closed` once the other end is gone."""

    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        for option in (socket.SO_SNDBUF, socket.SO_RCVBUF):
            sock.setsockopt(socket.SOL_SOCKET, option, SOCKET_BUFFER_BYTES)
        self.sock = sock
        self.closed = False
        self._unsent = bytearray()
        self._frames = Frames()

    def fileno(self) -> int:
        return self.sock.fileno()

    @property
    def has_unsent(self) -> bool:
        return bool(self._unsent)

    def send(self, message: Any) -> None:
        self.send_bytes(encode(message))

    def send_bytes(self, data: bytes) -> None:
        """Framed messages (`encode`'s), written after anything still unsent."""
        if not self.closed:
            self._unsent += data
            self.flush()

    def flush(self) -> bool:
        """Writes what the socket takes of what is unsent; whether nothing is left."""
        while self._unsent and not self.closed:
            try:
                written = self.sock.send(self._unsent)
            except BlockingIOError:
                return False
            except OSError:  # the other end is gone: nothing it was sent matters now
                self.closed = True
                self._unsent.clear()
            else:
                del self._unsent[:written]
        return True

    def flush_for(self, seconds: float) -> None:
        """flush until nothing is unsent, for at most `seconds` (a closing end's last words)."""
        deadline = time.monotonic() + seconds
        while not self.flush() and time.monotonic() < deadline:
            selector_wait(self.sock, selectors.EVENT_WRITE, deadline - time.monotonic())

    def receive(self) -> list[Any]:
        """Every message the socket holds now, in order (none: nothing complete arrived);
        sets `closed` at the other end's close."""
        messages: list[Any] = []
        while not self.closed:
            try:
                data = self.sock.recv(RECV_BYTES)
            except BlockingIOError:
                break
            except OSError:
                data = b""
            if not data:
                self.closed = True
                break
            messages += self._frames.feed(data)
        return messages

    def close(self) -> None:
        self.closed = True
        self.sock.close()


def selector_wait(sock: socket.socket, events: int, seconds: float) -> None:
    with selectors.DefaultSelector() as selector:
        selector.register(sock, events)
        selector.select(max(0.0, seconds))


def listen(path: str) -> socket.socket:
    """An API process's end before the core connects: a non-blocking listener on `path`."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)
    listener.setblocking(False)
    return listener


class CorePipes:
    """The engine core's ends of the API processes' pipes, in api_index order (module
    docstring). A pipe whose API process closed it reads as `closed` (receive says which)."""

    def __init__(self, paths: Sequence[str]) -> None:
        self._paths = list(paths)
        self._pipes: list[Pipe | None] = [None] * len(paths)
        # what is sent to a process before its pipe connects, framed, in order
        self._waiting = [bytearray() for _ in paths]
        self._dropped = [False] * len(paths)
        self._selector = selectors.DefaultSelector()
        self.connect()

    def __len__(self) -> int:
        return len(self._paths)

    def connect(self) -> None:
        """Tries each pipe not connected yet (its API process may not be listening yet)."""
        for index, path in enumerate(self._paths):
            if self._pipes[index] is None and not self._dropped[index]:
                self._connect(index, path)

    def _connect(self, index: int, path: str) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(path)
        except OSError:  # not listening yet
            sock.close()
            return
        pipe = self._pipes[index] = Pipe(sock)
        self._selector.register(sock, selectors.EVENT_READ, index)
        waiting, self._waiting[index] = self._waiting[index], bytearray()
        if waiting:
            pipe.send_bytes(bytes(waiting))
            self._watch_writes(index, pipe)

    def send(self, index: int, message: Any) -> None:
        """`message` to API process `index` (nothing once it is dropped)."""
        if self._dropped[index]:
            return
        pipe = self._pipes[index]
        if pipe is None:
            self._waiting[index] += encode(message)
            self.connect()
            return
        pipe.send(message)
        self._watch_writes(index, pipe)

    def _watch_writes(self, index: int, pipe: Pipe) -> None:
        """The selector also says when `pipe` can take more, while it has unsent bytes."""
        if not pipe.closed:
            events = selectors.EVENT_READ | (selectors.EVENT_WRITE if pipe.has_unsent else 0)
            self._selector.modify(pipe.sock, events, index)

    def wait(self, seconds: float) -> bool:
        """Whether a message (or a close) came from any API process, waiting up to `seconds`."""
        return bool(self._select(seconds))

    def receive(self) -> tuple[list[tuple[int, Any]], list[int]]:
        """([(api_index, message)] every message there now, in each pipe's order; the
        api_indexes whose pipes closed since), without waiting."""
        messages: list[tuple[int, Any]] = []
        closed: list[int] = []
        for index in self._select(0):
            pipe = self._pipes[index]
            messages += [(index, message) for message in pipe.receive()]
            if pipe.closed:
                closed.append(index)
                self.drop(index)
        return messages, closed

    def _select(self, seconds: float) -> list[int]:
        """The pipes readable within `seconds`; meanwhile connects the pipes not connected
        yet and writes what the sockets take of what is unsent."""
        if any(pipe is None and not dropped
               for pipe, dropped in zip(self._pipes, self._dropped, strict=True)):
            self.connect()
        if not self._selector.get_map():
            if seconds > 0:
                time.sleep(seconds)
            return []
        readable = []
        for key, events in self._selector.select(seconds):
            pipe = self._pipes[key.data]
            if events & selectors.EVENT_WRITE:
                pipe.flush()
                self._watch_writes(key.data, pipe)
            if events & selectors.EVENT_READ:
                readable.append(key.data)
        return readable

    def drop(self, index: int) -> None:
        """Sends process `index` nothing more and closes its pipe."""
        self._dropped[index] = True
        self._waiting[index].clear()
        pipe, self._pipes[index] = self._pipes[index], None
        if pipe is not None:
            self._selector.unregister(pipe.sock)
            pipe.close()

    def close(self, linger_s: float) -> None:
        """Writes what is unsent for up to `linger_s` (a Fatal must reach its API processes),
        then closes every pipe."""
        deadline = time.monotonic() + linger_s
        while time.monotonic() < deadline and any(self._waiting[i] or (p and p.has_unsent)
                                                  for i, p in enumerate(self._pipes)):
            self.wait(min(0.01, max(0.0, deadline - time.monotonic())))
        for index in range(len(self._paths)):
            self.drop(index)
        with contextlib.suppress(OSError):
            self._selector.close()
