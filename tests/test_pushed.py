"""PushedStream (server/pushed.py): the router's hand-off of one choice's outputs, held until
the response starts, then written framed to the connection; a plain token given as its parts
(`put_token`); a failure of one stream ends that stream alone, raised where its handler waits."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from resident.engine.types import RequestOutput
from resident.server.pushed import PushedStream


class Transport:
    """What the stream writes to: collects the bytes, or is closing."""

    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.closing = False

    def is_closing(self) -> bool:
        return self.closing

    def write(self, data: bytes) -> None:
        self.written.append(data)


def _events(outputs: list[RequestOutput]) -> bytes:
    return b"".join(b"E%s;" % ",".join(map(str, o.new_token_ids)).encode() for o in outputs)


def _stream(token_event=lambda token, cached: b"T%d;" % token, done=lambda: False):
    return PushedStream(_events, token_event, done)


def _start(stream: PushedStream, chunked: bool = True) -> Transport:
    transport = Transport()
    headers = {"Transfer-Encoding": "chunked"} if chunked else {}
    stream.start(SimpleNamespace(transport=transport), SimpleNamespace(headers=headers))
    return transport


def test_outputs_wait_for_the_start_then_go_framed():
    async def scenario():
        stream = _stream()
        stream.put_token("r", 7, 0)  # before the response: held, as an output
        assert await stream.first() == [RequestOutput("r", [7])]
        stream.put_nowait(RequestOutput("r", [8, 9]))
        transport = _start(stream)
        stream.put_token("r", 10, 32)
        return transport.written

    assert asyncio.run(scenario()) == [b"5\r\nE8,9;\r\n", b"4\r\nT10;\r\n"]


def test_a_token_its_event_does_not_render_goes_the_general_way():
    async def scenario():
        stream = _stream(token_event=lambda token, cached: None)
        stream.put_token("r", 1, 0)
        await stream.first()
        transport = _start(stream, chunked=False)
        stream.put_token("r", 2, 0)
        return transport.written

    assert asyncio.run(scenario()) == [b"E2;"]


@pytest.mark.parametrize("how", ["render", "transport"])
def test_a_failing_stream_ends_alone_with_its_error(how):
    def token_event(token, cached):
        raise RuntimeError("render failed")

    async def scenario():
        stream = _stream(token_event=token_event if how == "render" else
                         (lambda token, cached: b"T;"))
        stream.put_token("r", 1, 0)
        await stream.first()
        transport = _start(stream)
        transport.closing = how == "transport"
        stream.put_token("r", 2, 0)  # the router's call returns: the error goes to the handler
        stream.put_token("r", 3, 0)
        with pytest.raises((RuntimeError, ConnectionResetError)) as raised:
            await stream.wait()
        return raised.value, transport.written

    error, written = asyncio.run(scenario())
    assert written == []
    assert ("render failed" in str(error)) if how == "render" \
        else isinstance(error, ConnectionResetError)


def test_the_stream_ends_once_its_choice_is_done():
    async def scenario():
        finished = []
        stream = _stream(done=lambda: bool(finished))
        stream.put_token("r", 1, 0)
        await stream.first()
        _start(stream)
        finished.append(True)
        stream.put_nowait(RequestOutput("r", [2], True, "length"))
        await asyncio.wait_for(stream.wait(), 1)
        return stream.finished

    assert asyncio.run(scenario())
