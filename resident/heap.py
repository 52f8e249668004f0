"""Python's heap in a serving process: what its garbage collector walks, and its pauses."""

from __future__ import annotations

import gc
import time

GENERATIONS = (0, 1, 2)


def freeze_heap() -> None:
    """Moves every object alive now where Python's garbage collector never walks it: otherwise
    each full collection during serving traverses them all. The engine core calls it once its
    engine is built (the model, the graphs, the compiled code: a pause inside some step;
    vLLM and SGLang do the same after capture), each API process once it listens (aiohttp,
    zmq and the tokenizer: ~220k objects that every full collection walked; freezing them took
    the API's CPU a streamed token from 18.8 to 15.2 µs at c=64 on a 2-core host,
    results/2026-12-04-cpu-api-synthetic). Not for tests that build many engines."""
    gc.collect()
    gc.freeze()


def set_young_threshold(threshold: int) -> None:
    """How many tracked containers may be born (less those freed) before a young collection:
    a serving loop whose steps hold many short-lived ones crosses Python's 700 every step or
    two, though reference counting frees them; above a step's churn only lasting growth (new
    requests' state) triggers one. The older generations keep Python's thresholds."""
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(threshold, older, oldest)


class GcPauses:
    """The garbage collector's collections and wall seconds by generation from start() to
    stop(), or inside a with block (gc.callbacks): the bench's timed steps, or an engine core's
    life, where a pause stops every row of the step it falls in (/metrics:
    resident_gc_pause_seconds)."""

    def __init__(self) -> None:
        self.collections = dict.fromkeys(GENERATIONS, 0)
        self.seconds_by_generation = dict.fromkeys(GENERATIONS, 0.0)
        self._started = 0.0

    @property
    def seconds(self) -> float:
        return sum(self.seconds_by_generation.values())

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        generation = info["generation"]
        self.collections[generation] += 1
        self.seconds_by_generation[generation] += time.perf_counter() - self._started

    def stats(self) -> dict[str, dict[str, float]]:
        """Collections and pause seconds by generation, keyed by its digit (stats, /metrics)."""
        return {"gc_collections": {str(g): n for g, n in self.collections.items()},
                "gc_pause_seconds": {str(g): round(s, 6)
                                     for g, s in self.seconds_by_generation.items()}}

    def start(self) -> GcPauses:
        gc.callbacks.append(self._callback)
        return self

    def stop(self) -> None:
        gc.callbacks.remove(self._callback)

    def __enter__(self) -> GcPauses:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
