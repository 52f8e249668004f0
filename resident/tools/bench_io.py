"""What the bench CLIs share: the CUDA check the GPU ones start with and the JSON file they may
end with (their option types: resident.tool_args)."""

from __future__ import annotations

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
