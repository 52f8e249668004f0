"""StepBuffers' flat layout: every int array a view of one flat array at the same place on the
host and the device, and a varlen step's arrays one span of it (its one upload)."""

from __future__ import annotations

import itertools

import numpy as np
import torch

from resident.engine.buffers import (
    _INT_ARRAYS,
    VARLEN_ARRAYS,
    Capacity,
    HostStaging,
    StepBuffers,
    int_layout,
)

CAPACITY = Capacity(max_tokens=40, max_rows=5, max_pages=3, max_prefill_rows=2, max_chunks=4)


def test_the_arrays_tile_the_flat_array_in_order():
    layout = int_layout(CAPACITY)
    assert list(layout) == list(_INT_ARRAYS)
    places = list(layout.values())
    assert places[0].start == 0
    assert all(one.stop == two.start for one, two in itertools.pairwise(places))
    assert all(p.stop - p.start == _INT_ARRAYS[n](CAPACITY) for n, p in layout.items())


def test_a_varlen_steps_arrays_are_one_span_and_nothing_else():
    names = list(_INT_ARRAYS)
    first = names.index(VARLEN_ARRAYS[0])
    assert names[first:first + len(VARLEN_ARRAYS)] == list(VARLEN_ARRAYS)
    buffers = StepBuffers(CAPACITY, torch.device("cpu"))
    layout = int_layout(CAPACITY)
    span = buffers.varlen_span
    assert (span.start, span.stop) == (layout[VARLEN_ARRAYS[0]].start,
                                       layout[VARLEN_ARRAYS[-1]].stop)
    for name, place in layout.items():
        inside = span.start <= place.start and place.stop <= span.stop
        assert inside == (name in VARLEN_ARRAYS), name


def test_host_and_device_views_sit_at_the_same_places_of_their_flats():
    """Writing a host array and copying the flat span lands in the device array of that name."""
    buffers, host = StepBuffers(CAPACITY, torch.device("cpu")), HostStaging(CAPACITY, pin=False)
    for number, name in enumerate(_INT_ARRAYS, start=1):
        getattr(host, name)[:] = np.arange(getattr(host, name).size) + 1000 * number
    buffers.flat_gpu.copy_(torch.from_numpy(host.flat))
    for name in _INT_ARRAYS:
        device = getattr(buffers, f"{name}_gpu")
        assert device.data_ptr() >= buffers.flat_gpu.data_ptr()
        assert np.array_equal(device.numpy(), getattr(host, name)), name
