"""What one CPU of this host costs the API process's kinds of work, to set beside another host's.

    python tests/gpu/host_probe.py

Prints JSON: the CPU model and Python build, then µs per operation of a pure-Python call, a
cheap system call (getppid), a 200-byte send + recv over a Unix socket pair (a streamed event's
write and its reader's read), an epoll wait with one ready socket, unpickling a step's 64
RequestOutputs, and orjson (or the stdlib) encoding one stream event. Each is the best of five
timings, pinned to the CPU it starts on (issue 35: the API's µs a token on the H200's host was
~4x this project's VM's)."""

from __future__ import annotations

import json
import os
import pickle
import platform
import select
import socket
import sysconfig
import timeit

from resident.engine.types import RequestOutput
from resident.server.jsonenc import ENCODER, dumps


def _cpu_model() -> str:
    with open("/proc/cpuinfo") as info:
        for line in info:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor()


def _best_us(statement, number: int) -> float:
    return round(min(timeit.repeat(statement, number=number, repeat=5)) / number * 1e6, 3)


def _call() -> int:
    return 1


def main() -> None:
    os.sched_setaffinity(0, {os.sched_getaffinity(0).pop()})
    left, right = socket.socketpair()
    event = b"x" * 200
    poller = select.epoll()
    poller.register(right.fileno(), select.EPOLLIN)
    left.send(b"!")
    outputs = pickle.dumps([RequestOutput(f"cmpl-{i:032x}", [1234]) for i in range(64)], 5)
    chunk = {"index": 0, "text": "<|1234|>", "token_ids": [1234], "finish_reason": None,
             "logprobs": None}

    def send_recv() -> None:
        left.send(event)
        right.recv(4096)

    report = {
        "cpu": _cpu_model(), "cpus": os.cpu_count(), "python": platform.python_version(),
        "python_config": sysconfig.get_config_var("CONFIG_ARGS"), "json": ENCODER,
        "us_python_call": _best_us(_call, 200_000),
        "us_getppid": _best_us(os.getppid, 200_000),
        "us_send_recv_200b": _best_us(send_recv, 50_000),
        "us_epoll_ready": _best_us(lambda: poller.poll(0), 100_000),
        "us_unpickle_64_outputs": _best_us(lambda: pickle.loads(outputs), 20_000),
        "us_encode_event": _best_us(lambda: dumps(chunk), 100_000),
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
