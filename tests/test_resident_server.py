"""Resident planning end to end through `resident serve --model tiny --device cpu` (float64) with
the row check on: the same greedy tokens as host planning, and 0 row mismatches under slot
pressure and KV pressure."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
import torch

from resident.model.config import load_model_config
from resident.model.weights import load_model

from model_driver import greedy_alone
from server_fixture import Server, get, run, stream

TINY = load_model_config("tiny")
CHECKED = ("--set", "dtype=float64", "--set", "row_check=on")


def serve(*knobs: str) -> Server:
    return Server(*CHECKED, *knobs).wait_ready()


@pytest.fixture(scope="module")
def resident():
    srv = serve()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def host_planned():
    srv = serve("--set", "resident_planning=off")
    yield srv
    srv.stop()


def prompts(count: int, seed: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, 40, (count,), generator=generator).tolist()
    return [torch.randint(0, TINY.vocab_size, (n,), generator=generator).tolist()
            for n in lengths]


def outputs(server: Server, batch: list[list[int]], max_tokens: int, concurrency: int):
    async def drive():
        semaphore = asyncio.Semaphore(concurrency)
        async with aiohttp.ClientSession() as session:
            async def one(prompt):
                async with semaphore:
                    events = await stream(session, server.url, {
                        "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True})
                return [e["choices"][0]["token_ids"][0] for e in events]
            return await asyncio.gather(*(one(p) for p in batch))
    return run(drive())


def rowcheck(server: Server) -> dict:
    status, counts = run(get(server.url + "/debug/rowcheck"))
    assert status == 200
    return counts


def assert_resident_and_clean(server: Server) -> dict:
    assert "resident planning on llm: " in server.log()
    counts = rowcheck(server)
    print(f"row check: {counts}")
    assert counts["enabled"] and counts["steps"] > 0 and counts["rows"] > 0
    assert counts["mismatches"] == 0
    return counts


@pytest.mark.parametrize("concurrency", [1, 8])
def test_auto_and_off_give_the_same_greedy_tokens(resident, host_planned, concurrency):
    batch = prompts(32, seed=concurrency)
    got = outputs(resident, batch, 12, concurrency)
    assert got == outputs(host_planned, batch, 12, concurrency)
    assert assert_resident_and_clean(resident)["displaced"] == 0
    assert "resident planning on llm" not in host_planned.log()
    assert rowcheck(host_planned)["steps"] == 0


def test_debug_config_reports_the_planner(resident, host_planned):
    _, config = run(get(resident.url + "/debug/config"))
    assert config["planning_mode"] == "resident" and config["host_plan_free"]
    assert "slots of" in config["planning_reason"]
    _, config = run(get(host_planned.url + "/debug/config"))
    assert config["planning_mode"] == "off"
    assert config["planning_reason"].startswith("resident_planning=off")


def pressured(knobs: list[str], num_requests: int, max_tokens: int, seed: int) -> dict:
    """All requests at once on a server under pressure: its row-check counts, after checking
    every output against the model run alone."""
    model = load_model(TINY, "cpu", torch.float64)
    server = serve(*(arg for knob in knobs for arg in ("--set", knob)))
    try:
        batch = prompts(num_requests, seed=seed)
        got = outputs(server, batch, max_tokens, concurrency=num_requests)
        counts = assert_resident_and_clean(server)
    finally:
        server.stop()
    assert got == [greedy_alone(model, p, max_tokens) for p in batch]
    return counts


def test_slot_pressure_displaces_and_stays_exact():
    counts = pressured(["decode_buckets=1,2,4", "decode_order=turns"], 24, 10, seed=3)
    assert counts["displaced"] > 0


def test_kv_pressure_offloads_give_slots_up_and_stay_exact():
    counts = pressured(["num_kv_pages=25", "prefill_token_budget=64"], 8, 60, seed=4)
    assert counts["offloads"] > 0
    assert counts["slot_releases"] + counts["offloads_without_slot"] == counts["offloads"]
    assert counts["slot_releases"] > 0
