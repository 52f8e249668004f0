"""What the bench CLIs share: the CUDA check the GPU ones start with, the JSON file they may end
with, and the comma-separated lists of sizes they take."""

from __future__ import annotations

import argparse
import json
import sys

import torch


def require_cuda(tool: str) -> bool:
    """True on a CUDA host; otherwise says so on stderr (the CLI then exits 2)."""
    if torch.cuda.is_available():
        return True
    print(f"{tool} needs a CUDA device", file=sys.stderr)
    return False


def write_json(path: str | None, data) -> None:
    """Writes `data` to `path` when one was given (--json)."""
    if path:
        with open(path, "w") as handle:
            json.dump(data, handle, indent=1)


def positive_ints(parser: argparse.ArgumentParser, option: str, text: str) -> list[int]:
    """`text` ("1,16,64") as positive integers; a parser error naming `option` otherwise."""
    try:
        values = [int(part) for part in text.split(",")]
    except ValueError:
        parser.error(f"{option} {text!r}: expected positive integers like 1,16,64")
    if not values or min(values) < 1:
        parser.error(f"{option} {text!r}: expected positive integers like 1,16,64")
    return values
