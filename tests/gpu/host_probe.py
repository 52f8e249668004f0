"""What one CPU of this host costs the API process's kinds of work, to set beside another host's.

    python tests/gpu/host_probe.py

Prints JSON: the CPU model and Python build, then µs per operation of a pure-Python call, a
cheap system call (getppid), a 200-byte send + recv over a Unix socket pair (a streamed event's
write and its reader's read), an epoll wait with one ready socket, unpickling a step's 64
RequestOutputs, and orjson (or the stdlib) encoding one stream event. Each is the best of five
timings, pinned to the CPU it starts on (issue 35: the API's µs a token on the H200's host was
~4x this project's VM's).

Then the wall time a message takes from one process to another that waits for it in a poll, as
the idle engine core waits for a request and the API for a step's outputs (p10/p50/p90 over 60
messages 5 ms apart): over zmq PUSH/PULL on ipc, the engine's pipes (each message through both
sides' zmq I/O threads), the same with the receiver polling without a wait (no wake-up of
its own thread), and over a Unix stream socket (one wake-up). On the project's VM: zmq ~0.5
ms, spinning ~0.06, the socket 0.06-0.2."""

from __future__ import annotations

import json
import multiprocessing
import os
import pickle
import platform
import select
import socket
import sysconfig
import tempfile
import time
import timeit

import zmq

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


NUM_MESSAGES = 60
GAP_S = 0.005


def _zmq_receiver(addr: str, results, timeout_ms: int = 50) -> None:
    with zmq.Context() as context, context.socket(zmq.PULL) as pull:
        pull.connect(addr)
        results.put([_arrival_delay(lambda: pull.poll(timeout_ms), pull.recv_pyobj)
                     for _ in range(NUM_MESSAGES)])


def _zmq_spinning_receiver(addr: str, results) -> None:
    _zmq_receiver(addr, results, timeout_ms=0)


def _unix_receiver(path: str, results) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.connect(path)
        poller = select.poll()
        poller.register(conn, select.POLLIN)
        results.put([_arrival_delay(lambda: poller.poll(50), lambda: pickle.loads(conn.recv(64)))
                     for _ in range(NUM_MESSAGES)])


def _arrival_delay(wait, receive) -> float:
    while not wait():
        pass
    return time.monotonic() - receive()


def _one_way_ms(receiver, where: str, sender) -> list[float]:
    """p10/p50/p90 ms of a monotonic stamp's trip to `receiver`'s process; `sender()`, called
    once it runs, gives the function that sends a stamp."""
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    process = context.Process(target=receiver, args=(where, results))
    process.start()
    send = sender()
    time.sleep(0.5)  # connected
    for _ in range(NUM_MESSAGES):
        send(time.monotonic())
        time.sleep(GAP_S)
    delays = sorted(results.get(timeout=30))
    process.join()
    return [round(delays[int(len(delays) * f)] * 1e3, 3) for f in (0.1, 0.5, 0.9)]


def _pipe_latencies() -> dict[str, list[float]]:
    with tempfile.TemporaryDirectory() as folder:
        with zmq.Context() as context, context.socket(zmq.PUSH) as push:
            addr = f"ipc://{folder}/probe.ipc"
            push.bind(addr)
            zmq_ms = _one_way_ms(_zmq_receiver, addr, lambda: push.send_pyobj)
            zmq_spin_ms = _one_way_ms(_zmq_spinning_receiver, addr, lambda: push.send_pyobj)
        path = f"{folder}/probe.sock"
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
            listener.bind(path)
            listener.listen(1)
            accepted = []

            def sender():
                accepted.append(listener.accept()[0])
                return lambda stamp: accepted[0].send(pickle.dumps(stamp))

            unix_ms = _one_way_ms(_unix_receiver, path, sender)
            accepted[0].close()
    return {"ms_zmq_ipc_one_way_p10_p50_p90": zmq_ms,
            "ms_zmq_ipc_spinning_receiver_p10_p50_p90": zmq_spin_ms,
            "ms_unix_socket_one_way_p10_p50_p90": unix_ms}


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
    os.sched_setaffinity(0, range(os.cpu_count()))  # the receivers get a CPU of their own
    report |= _pipe_latencies()
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
