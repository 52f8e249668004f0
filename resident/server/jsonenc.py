"""JSON for the API: orjson where it is installed, else the stdlib (a host without a package
registry may lack orjson).

Encoding (`dumps`, the stream events): a streamed token's event encodes ~9x faster with orjson
on the project's VM (resident/tools/json_bench.py); the output is the same JSON but for
whitespace, compact UTF-8 bytes either way. They differ on NaN and infinities, which the API
keeps out of its answers (-inf logprobs are written -9999.0, api.LOGPROB_FLOOR): orjson writes
null, the stdlib NaN / Infinity (not JSON).

Decoding (`loads`, the request bodies): orjson reads a 1,280-token prompt's body in 26 µs where
the stdlib takes 70. It is the stricter of the two (it refuses lone surrogates, NaN literals,
a BOM and UTF-16, which the stdlib reads), and reads an integer past 64 bits as a float where
the stdlib keeps the integer; the API reads again with the stdlib whatever orjson refuses or
reads into an invalid request (api._parse), so the stdlib's reading always decides."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

try:
    import orjson
except ImportError:  # pragma: no cover - exercised on hosts without it
    orjson = None

ENCODER = "orjson" if orjson is not None else "json"


FAST_LOADS = orjson is not None  # loads is not the stdlib's


def loads(raw: bytes) -> Any:
    """The JSON document `raw` (ValueError where it is not one, as json.loads)."""
    return orjson.loads(raw) if orjson is not None else json.loads(raw)


def _stdlib_dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


# `obj` as compact JSON bytes; TypeError for what JSON cannot hold. orjson's own function where
# it is installed, not a wrapper around it: every streamed token's event calls it
dumps: Callable[[Any], bytes] = orjson.dumps if orjson is not None else _stdlib_dumps
