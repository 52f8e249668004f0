"""What the API's handlers share: the engine client, the tokenizer, the limits, the metrics
registry and the in-flight count (serve.py reads it to drain and to fail in-flight work)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.multiprocess import MultiProcessCollector

from resident.config import EngineConfig
from resident.server.chat_template import ChatTemplate
from resident.server.client import EngineClient, EngineUnavailable
from resident.server.metrics import EngineCollector
from resident.server.tokenizer import Tokenizer


@dataclass
class ApiState:
    """What the handlers share; serve.py reads it to drain and to fail in-flight work."""

    client: EngineClient
    tokenizer: Tokenizer
    model_name: str
    limits: EngineConfig  # the resolved knobs: max_num_seqs, max_waiting, the timeouts
    chat_template: ChatTemplate  # renders /v1/chat/completions messages
    started: int = field(default_factory=lambda: int(time.time()))  # /v1/models' `created`
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    engine_metrics: EngineCollector = field(default_factory=EngineCollector)
    http_requests: Counter = field(init=False)
    in_flight: int = 0  # engine requests being answered (a choice is one)
    draining: bool = False  # SIGTERM: no new completions

    def __post_init__(self) -> None:
        self.registry.register(self.engine_metrics)
        # several API processes (api_processes.py): each counts into the shared directory and
        # a scrape of any of them sums all (the counter itself then stays unregistered)
        shared = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
        self.http_requests = Counter("resident_http_requests", "HTTP requests answered.",
                                     ["route", "code"],
                                     registry=None if shared else self.registry)
        if shared:
            MultiProcessCollector(self.registry, path=shared)

    @property
    def max_in_flight(self) -> int:
        return self.limits.max_num_seqs + self.limits.max_waiting

    @property
    def max_body_bytes(self) -> int:
        return int(self.limits.max_body_mib * 2**20)


STATE = web.AppKey("resident_state", ApiState)



def ready_client(request: web.Request) -> EngineClient:
    """The engine client, or EngineUnavailable (a 503) while the engine starts or after it
    failed."""
    client = request.app[STATE].client
    if not client.is_ready:
        raise EngineUnavailable(client.fatal or "the engine is still starting")
    return client
