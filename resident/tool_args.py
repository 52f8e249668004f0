"""What the argparse tools (resident/tools, gate/tools) share: the types of their count options
and of their comma-separated lists of counts, whose errors argparse prefixes with the option's
name ("argument --steps: must be >= 1, got 0"), and the --format option their one render path
takes."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from resident.render import OutputFormat


def _at_least(least: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < least:
            raise argparse.ArgumentTypeError(f"must be >= {least}, got {value}")
        return value
    return parse


count = _at_least(1)  # an option counting things that must happen at least once
non_negative = _at_least(0)


def counts(text: str) -> list[int]:
    """A comma-separated list of counts ("1,16,64"), each >= 1."""
    try:
        values = [int(part) for part in text.split(",")]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers like 1,16,64, got "
                                         f"{text!r}")
    return values


def _in_range(name: str, test: Callable[[float], bool],
              expected: str) -> Callable[[str], float]:
    """A float option checked as SamplingParams checks `name`, whose name its error gives."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not test(value):
            raise argparse.ArgumentTypeError(f"{name} must be {expected}, got {value}")
        return value
    return parse


def add_draw(parser: argparse.ArgumentParser) -> None:
    """--temperature and --top-p: how every request draws, in SamplingParams' ranges."""
    parser.add_argument("--temperature", default=0.0,
                        type=_in_range("temperature", lambda t: 0 <= t < float("inf"),
                                        ">= 0 and finite"),
                        help="every request's temperature (0: greedy)")
    parser.add_argument("--top-p", default=1.0,
                        type=_in_range("top_p", lambda p: 0 < p <= 1, "in (0, 1]"),
                        help="every request's top_p")


def add_format(parser: argparse.ArgumentParser) -> None:
    """--format: table (rich, on stdout) or json (resident.render)."""
    parser.add_argument("--format", choices=[f.value for f in OutputFormat], default="table")
