"""Run the exposition tests against the lowest allowed version of each core dependency.

Checks that .ci/constraints-lowest.txt names, for every dependency in pyproject.toml, a release
that satisfies the pin and is the pin's own version (``>=12.535`` → ``12.535.x``), then
installs exactly those into a throwaway virtualenv (no project install, nothing written to the
tree) and runs ``tests/server/test_exposition.py`` there against the source tree.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONSTRAINTS = ROOT / ".ci" / "constraints-lowest.txt"
TEST_TOOLS = ("pytest", "pytest-asyncio", "pytest-timeout")  # pyproject's pytest settings
_PIN = re.compile(r"^([A-Za-z0-9_.-]+)>=([0-9][0-9.]*)$")


def _name(text: str) -> str:
    return re.sub(r"[-_.]+", "-", text).lower()


def check_constraints(project: dict[str, object]) -> list[str]:
    """The core dependencies' pins, checked against the constraints file."""
    deps = project["dependencies"]
    assert isinstance(deps, list)
    lowest = {}
    for raw in CONSTRAINTS.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            lowest[_name(name)] = version
    problems = []
    for spec in deps:
        match = _PIN.match(spec.replace(" ", ""))
        if match is None:
            problems.append(f"{spec}: expected a plain 'name>=version' pin")
            continue
        name, pin = _name(match.group(1)), match.group(2)
        got = lowest.pop(name, None)
        if got is None:
            problems.append(f"{name}: missing from {CONSTRAINTS.name}")
        elif got != pin and not got.startswith(pin + "."):
            problems.append(f"{name}: pyproject pins >={pin}, {CONSTRAINTS.name} has {got}")
    problems += [f"{name}: in {CONSTRAINTS.name} but not a dependency" for name in lowest]
    return problems


def dev_specs(project: dict[str, object]) -> list[str]:
    extras = project["optional-dependencies"]
    assert isinstance(extras, dict)
    return [s for s in extras["dev"] if _name(re.split(r"[<>=!~ ]", s)[0]) in TEST_TOOLS]


def main() -> int:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    problems = check_constraints(project)
    if problems:
        for problem in problems:
            print(f"lowest: {problem}", file=sys.stderr)
        return 1
    deps = [str(d) for d in project["dependencies"]]
    with tempfile.TemporaryDirectory(prefix="lowest-") as tmp:
        venv = Path(tmp) / "venv"
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        python = str(venv / "bin" / "python")
        pip = [python, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        subprocess.run([*pip, "-c", str(CONSTRAINTS), *deps, *dev_specs(project)], check=True)
        subprocess.run([python, "-m", "pip", "freeze"], check=True)
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        test = [python, "-m", "pytest", "-q", "tests/server/test_exposition.py"]
        return subprocess.run(test, cwd=ROOT, env=env, check=False).returncode


if __name__ == "__main__":
    raise SystemExit(main())
