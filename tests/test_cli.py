"""The command table: ``--help`` names every command, an unknown command is an error."""

from __future__ import annotations

import subprocess
import sys

import pytest
from support.paths import ROOT

from exporter.cli import COMMANDS, PROG


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "exporter.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=ROOT,
    )


def test_help_lists_every_command_in_one_line() -> None:
    result = run_cli("--help")
    assert result.returncode == 0
    block = result.stdout.split("\ncommands:\n", 1)[1]
    lines = block.splitlines()[: len(COMMANDS)]
    assert [line.split()[0] for line in lines] == [command.name for command in COMMANDS]
    for line, command in zip(lines, COMMANDS, strict=True):
        assert line.strip().endswith(command.summary)
    # The server's flags are still there, above the commands.
    assert "--web.listen-address" in result.stdout.split("\ncommands:\n", 1)[0]


@pytest.mark.parametrize(
    "argv",
    [["injekt"], ["injekt", "--help"], ["frobnicate", "--version"], ["Serve"], ["diagnos", "-h"]],
)
def test_an_unknown_command_is_one_line_and_exit_2(argv: list[str]) -> None:
    result = run_cli(*argv)
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith(f"{PROG}: error: unknown command {argv[0]!r}")
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("name", [command.name for command in COMMANDS])
def test_every_command_answers_help(name: str) -> None:
    result = run_cli(name, "--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: ")
