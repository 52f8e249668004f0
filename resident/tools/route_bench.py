"""What a streamed token costs on its way from the engine core to its client's socket, in
Python: the core's packing and pickling of a step's outputs, and the API process's unpickling,
routing and rendering of them, up to the transport's write (a null transport: no system call).

    python -m resident.tools.route_bench [--streams 64] [--steps 2000] [--format table|json]

The API side runs the server's own objects: an EngineClient's router (`_route`, what its pipe
reader calls a message), a `_Completion` and its PushedStream for each of `--streams` streamed
requests of the byte tokenizer, each step one output a stream (a decode step's). Reports µs a
token, the best of five rounds (the least disturbed by other processes). The served figure
(`gate.tools.api_profile --synthetic-decode`) adds the socket's send, the event loop and HTTP.
"""

from __future__ import annotations

import argparse
import asyncio
import pickle
import sys
import time
from functools import partial
from types import SimpleNamespace
from typing import Any

from resident.config import EngineConfig
from resident.engine.types import RequestOutput
from resident.render import OutputFormat, render
from resident.server.api import _Completion
from resident.server.chat_template import load_chat_template
from resident.server.client import EngineClient
from resident.server.protocol import StepOutputs
from resident.server.pushed import PushedStream
from resident.server.state import ApiState
from resident.server.tokenizer import ByteTokenizer
from resident.server.validation import parse_completion_request
from resident.tool_args import add_format, count

ROUNDS = 5
VOCAB = 512
TOKENS = 4096  # distinct token rows before they repeat


class NullTransport:
    """Takes writes and drops them."""

    def is_closing(self) -> bool:
        return False

    def write(self, data: bytes) -> None:
        pass


def _streams(client: EngineClient, state: ApiState, num_streams: int) -> list[str]:
    """num_streams streamed completions routed by `client`, each writing to a null transport;
    their request ids."""
    body = {"model": "tiny", "prompt": "Hi", "max_tokens": 1 << 30, "stream": True}
    request = SimpleNamespace(transport=NullTransport())
    response = SimpleNamespace(headers={"Transfer-Encoding": "chunked"})
    ids = []
    for _ in range(num_streams):
        parsed = parse_completion_request(body, state.tokenizer, "tiny", VOCAB, 1 << 31)
        completion = _Completion(state, parsed, False, 0.0)
        choice = completion.choices[0]
        pushed = PushedStream(partial(completion._events, choice),
                              partial(completion._token_events, choice),
                              partial(getattr, choice, "done"))
        pushed.start(request, response)
        client._streams[choice.request.request_id] = pushed
        ids.append(choice.request.request_id)
    return ids


def _best_us(run, num_tokens: int) -> float:
    best = float("inf")
    for _ in range(ROUNDS):
        start = time.process_time()
        run()
        best = min(best, time.process_time() - start)
    return best / num_tokens * 1e6


async def measure(num_streams: int, num_steps: int) -> dict[str, Any]:
    client = EngineClient(f"inproc://route-bench-requests-{id(num_streams)}",
                          f"inproc://route-bench-outputs-{id(num_streams)}")
    try:
        state = ApiState(client, ByteTokenizer(VOCAB), "tiny", EngineConfig(),
                         load_chat_template(None))
        ids = _streams(client, state, num_streams)
        steps = [[RequestOutput(request_id, [256 + (step * 7 + row) % (VOCAB - 256)])
                  for row, request_id in enumerate(ids)] for step in range(min(num_steps, 64))]
        step_outputs = [steps[i % len(steps)] for i in range(num_steps)]
        messages: list[bytes] = []

        def pack() -> None:
            messages[:] = [pickle.dumps(StepOutputs.of(outputs)) for outputs in step_outputs]

        def route() -> None:
            for message in messages:
                client._route(pickle.loads(message))

        num_tokens = num_streams * num_steps
        core_us = _best_us(pack, num_tokens)
        api_us = _best_us(route, num_tokens)
        return {"streams": num_streams, "steps": num_steps,
                "core_pack_us_per_token": round(core_us, 3),
                "api_route_us_per_token": round(api_us, 3),
                "bytes_per_step": round(sum(map(len, messages)) / len(messages))}
    finally:
        await client.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=count, default=64)
    parser.add_argument("--steps", type=count, default=2000)
    add_format(parser)
    args = parser.parse_args(argv)
    render({"route_bench": asyncio.run(measure(args.streams, args.steps))},
           OutputFormat(args.format))
    return 0


if __name__ == "__main__":
    sys.exit(main())
