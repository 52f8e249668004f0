"""Both command lines' help in the ecosystem's style (metavars that say what a value is, flags
shown as flags, defaults as [default: X]), their --version, and `resident knobs`."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import re
import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

import resident.cli
from gate.cli import app as gate_app
from gate.config import GateConfig
from resident.config import EngineConfig, env_name

ROOT = Path(__file__).resolve().parents[1]
ENV = {"COLUMNS": "200", "NO_COLOR": "1"}
PYTHON_TYPES = re.compile(r"<(bool|int|float|str|list\[[^>]*\]|path)>")
FLAGS = ("--resume", "--until-verdict", "--aa", "--help")


def _gate(*args: str):
    return CliRunner().invoke(gate_app, list(args), env=ENV)


# every command the app has (check's --help once failed: its command took no help flag)
@pytest.mark.parametrize("command", [c.callback.__name__ for c in gate_app.registered_commands])
def test_help_names_values_not_python_types(command):
    result = _gate(command, "--help")
    assert result.exit_code == 0, result.output
    assert not PYTHON_TYPES.search(result.output), PYTHON_TYPES.search(result.output).group()
    for flag in FLAGS:  # a flag's line holds no metavar between it and its help
        for line in result.output.splitlines():
            if re.search(rf"│ {flag}\b(?!-)", line):
                assert re.search(rf"{flag}(\s+--no-\w+)?\s{{3,}}[A-Z]", line), line


def test_check_help_offers_only_the_arms_the_check_takes():
    check = " ".join(_gate("check", "--help").output.split())
    assert "git:<ref>" in check and "cmd:<" not in check and "no cmd:" in check
    assert "cmd:<server command" in " ".join(_gate("run", "--help").output.split())


def test_run_help_shows_every_default_in_one_style():
    output = _gate("run", "--help").output
    assert "--arm" in output and "NAME=SPEC" in output and "INT,..." in output
    defaults = {field.name: field.default for field in dataclasses.fields(GateConfig)}
    for field in ("model", "device", "prompt_len", "shared_prefix_len", "output_len", "rounds",
                  "runs", "seed",
                  "requests_per_slot", "min_effect", "name", "startup_timeout"):
        assert f"[default: {defaults[field]}]" in output, field
    for text in ("[default: 1,16,64]", "[default: max(8, requests-per-slot x concurrency)]",
                 "[default: 0 with --device cuda]", "[default: results/<name>-<time>]",
                 "[default: table]", "[default: --no-aa]"):
        assert text in output, text
    assert not re.search(r"\[(tiny|cpu|gate|512)\]", output)  # the old bare style
    assert "--sessions" not in output  # the old name of --rounds is gone


def _resident(*args: str):
    return CliRunner().invoke(resident.cli.app, list(args), env=ENV)


# typer's own labels: <str>, <int range>, <list[str]>, <auto|cpu|cuda>
TYPER_LABELS = re.compile(r"<(bool|int|float|str|list|path)\b|<\w+(\|\w+)+>")


@pytest.mark.parametrize("command, metavars", [
    ((), ()),
    (("serve",), ("KNOB=VALUE", "INT", "HOST", "KEY", "LEVEL", "[auto|cpu|cuda]")),
    (("info",), ("INT", "FLOAT", "[bfloat16|float16|float32]", "[table|json]")),
    (("knobs",), ("[table|json]",)),
])
def test_resident_help_names_values_not_python_types(command, metavars):
    result = _resident(*command, "--help")
    assert result.exit_code == 0, result.output
    assert not TYPER_LABELS.search(result.output), TYPER_LABELS.search(result.output).group()
    for metavar in metavars:
        assert f" {metavar} " in result.output, metavar
    lines = result.output.splitlines()
    flags = [line for line in lines if re.search(r"│ --(help|version)\b", line)]
    assert len(flags) == (2 if not command else 1)
    for line in flags:  # a flag's line holds no metavar between it and its help
        assert re.search(r"--(help|version)\s{3,}[A-Z]", line), line


def test_resident_help_shows_ranges_and_defaults_in_words():
    serve = " ".join(_resident("serve", "--help").output.split())
    assert "[OPTIONS] {MODEL}" in serve and "MODEL: a shipped config" in serve
    assert "Port to bind, 1-65535. [default: 8000]" in serve
    assert "[default: 127.0.0.1]" in serve and "[default: auto]" in serve
    info = " ".join(_resident("info", "--help").output.split())
    assert "at least 0.001" in info and "[default: 4.28]" in info
    assert "<=" not in serve + info and ">=" not in serve + info
    # a command's first paragraph is one line of the command list, not wrapped as its source is
    root = _resident("--help").output.splitlines()
    knobs = next(i for i, line in enumerate(root) if line.startswith("│ knobs "))
    assert root[knobs].rstrip(" │").endswith("environment variable and meaning."), root[knobs]
    assert not re.match(r"│\s{3,}\S", root[knobs + 1]), root[knobs + 1]


@pytest.mark.parametrize("args, message", [
    (("serve", "tiny", "--port", "0"), "must be 1-65535, not 0"),
    (("serve", "tiny", "--port", "65536"), "must be 1-65535, not 65536"),
    (("info", "tiny", "--bandwidth", "0"), "must be at least 0.001, not 0.0"),
    (("info", "tiny", "--context", "-1"), "must be at least 0, not -1"),
])
def test_resident_ranges_still_hold(args, message):
    result = _resident(*args)
    assert result.exit_code == 2 and message in result.output, result.output


def _pyproject_version() -> str:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def test_both_clis_print_the_package_version():
    version = _pyproject_version()
    gate_cli = _gate("--version")
    assert gate_cli.exit_code == 0 and gate_cli.stdout == f"resident-gate {version}\n"
    engine = CliRunner().invoke(resident.cli.app, ["--version"], env=ENV)
    assert engine.exit_code == 0 and engine.stdout == f"resident {version}\n"


def test_the_version_falls_back_to_pyproject_when_not_installed(monkeypatch):
    def not_installed(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", not_installed)
    assert _resident("--version").output.split() == ["resident", _pyproject_version()]


def test_resident_knobs_lists_every_knob():
    result = CliRunner().invoke(resident.cli.app, ["knobs", "--format", "json"], env=ENV)
    assert result.exit_code == 0, result.output
    rows = {row["name"]: row for row in json.loads(result.stdout)["knobs"]}
    fields = dataclasses.fields(EngineConfig)
    assert list(rows) == [field.name for field in fields]
    for field in fields:
        row = rows[field.name]
        assert row["what"], f"{field.name} has no meaning in resident.cli.KNOB_MEANINGS"
        assert row["env"] == env_name(field.name)
    assert rows["resident_planning"]["env"] == "RESIDENT_PLANNING"
    assert rows["plan_ahead"]["values"] == "off | on | launch"
    assert rows["plan_ahead"]["default"] == "launch"
    assert rows["decode_buckets"]["default"].startswith("1,2,4,8,")
    assert rows["page_size"]["values"] == "integer"
    table = CliRunner().invoke(resident.cli.app, ["knobs"], env=ENV)
    assert table.exit_code == 0 and "RESIDENT_PAGE_SIZE" in table.stdout
