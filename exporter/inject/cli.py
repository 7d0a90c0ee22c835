"""``inference-bottleneck-exporter inject``: the sidecar into manifests, for GitOps.

Reads Kubernetes YAML (files, or ``-``/nothing for stdin; several documents each), puts the
sidecar into every pod template whose engine it recognises (:mod:`exporter.inject.patch`, the
admission webhook's code path), and writes the result to stdout, back to the files
(``--in-place``) or as a unified diff (``--dry-run``). Documents it does not change are written
back as they were read, so a second run changes nothing. Input it cannot place a sidecar in
ends in one line and exit code 2, before anything is written.
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import yaml

from exporter.config import ArgumentParser, usage_error
from exporter.inject.patch import Options, PlacementError, apply, plan
from exporter.inject.places import get, places
from exporter.inject.sidecar import Values, ValuesError, native_default

PROG = "inference-bottleneck-exporter inject"
_SEPARATOR = re.compile(r"^---[ \t]*(#.*)?$", re.MULTILINE)


class InjectError(Exception):
    """Input that cannot be injected (one line)."""


def _fail(message: str) -> NoReturn:
    usage_error(PROG, message)


@dataclass
class Source:
    """One input: its name, text, documents, and each document's original text."""

    name: str
    path: Path | None
    text: str
    docs: list[Any]
    chunks: list[str] | None


def _chunks(text: str, count: int) -> list[str] | None:
    """The text of each document, where the text splits into exactly ``count`` of them."""
    parts = _SEPARATOR.split(text)
    # re.split with a group returns the group too; keep the bodies only.
    bodies = parts[0::2]
    kept = [b for b in bodies if yaml.safe_load(b) is not None]
    return kept if len(kept) == count else None


def read_source(name: str) -> Source:
    path = None if name == "-" else Path(name)
    try:
        text = sys.stdin.read() if path is None else path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise InjectError(f"{name}: cannot read ({err})") from None
    label = "stdin" if path is None else name
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as err:
        raise InjectError(f"{label}: not YAML ({' '.join(str(err).split())})") from None
    for doc in docs:
        if not isinstance(doc, dict) or "kind" not in doc:
            raise InjectError(f"{label}: a document is not a Kubernetes object (no kind)")
    try:
        chunks = _chunks(text, len(docs))
    except yaml.YAMLError:
        chunks = None
    return Source(label, path, text, docs, chunks)


class _Dumper(yaml.SafeDumper):
    """Lists indented under their key, as kubectl and Helm write them."""

    def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
        super().increase_indent(flow, False)


def _dump(doc: Any) -> str:
    return yaml.dump(doc, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=1 << 16)


@dataclass
class Outcome:
    """What injecting found: pod templates with the sidecar, every pod template seen, and the
    objects that hold none (by ``Kind/name``)."""

    placed: int = 0
    templates: list[str] = field(default_factory=list)
    bare: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, other: Outcome) -> None:
        self.placed += other.placed
        self.templates += other.templates
        self.bare += other.bare
        self.notes += other.notes


def inject_object(doc: Any, values: Values, options: Options, name: str) -> tuple[Any, Outcome]:
    """One object with the sidecar in its pod templates (each item of a ``List``, as ``kubectl
    get -o yaml`` writes several), and what was found."""
    outcome = Outcome()
    if doc.get("kind") == "List" and isinstance(doc.get("items"), list):
        items = []
        for item in doc["items"]:
            new_item = item
            if isinstance(item, dict):
                new_item, found = inject_object(item, values, options, name)
                outcome.add(found)
            items.append(new_item)
        return ({**doc, "items": items} if outcome.placed else doc), outcome
    new = doc
    templates = places(doc)
    if not templates:
        title = get(doc, ("metadata", "name")) or ""
        outcome.bare.append(f"{doc.get('kind')}/{title}")
    for place in templates:
        try:
            result = plan(new, place, values, options)
        except PlacementError as err:
            raise InjectError(f"{name}: {err}") from None
        outcome.templates.append(place.name)
        outcome.notes += result.notes
        if result.endpoint is not None:
            outcome.placed += 1
        new = apply(new, result.operations)
    return new, outcome


def inject_source(source: Source, values: Values, options: Options) -> tuple[str, Outcome]:
    """The new text of one input, and what was found in it."""
    out: list[str] = []
    outcome = Outcome()
    for index, doc in enumerate(source.docs):
        new, found = inject_object(doc, values, options, source.name)
        outcome.add(found)
        if new == doc and source.chunks is not None:
            out.append(source.chunks[index].strip("\n") + "\n")
        else:
            head = _leading_comments(source.chunks[index]) if source.chunks else ""
            out.append(head + _dump(new))
    return _join(out, source.text), outcome


def _listed(names: Sequence[str], limit: int = 3) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def nothing_placed(outcome: Outcome) -> str:
    """Why no sidecar was placed, and what to do, in one line."""
    if not outcome.templates:
        return (
            f"no pod template found in {_listed(outcome.bare) or 'the input'} (inject reads "
            "workloads, KServe, LeaderWorkerSet, NIMService, DynamoGraphDeployment and any "
            "kind's template fields); the admission webhook injects any pod: label its "
            "namespace or annotate its pods"
        )
    count = len(outcome.templates)
    return (
        f"no engine found in the {count} pod template{'s' if count > 1 else ''} found "
        f"({_listed(outcome.templates)}): no container runs a known engine's command line or "
        "image; give --engine-url, or let the admission webhook inject the pods"
    )


def _leading_comments(chunk: str) -> str:
    """The comment lines a document opens with (its title, where it came from): kept when the
    document is written anew. Comments inside it are not."""
    lines = []
    for line in chunk.lstrip("\n").splitlines(keepends=True):
        if not line.startswith("#"):
            break
        lines.append(line)
    return "".join(lines)


def _join(documents: list[str], original: str) -> str:
    text = "---\n".join(documents)
    return ("---\n" + text) if original.lstrip().startswith("---") else text


def _values(path: Path | None, args: argparse.Namespace) -> Values:
    user: dict[str, Any] = {}
    if path is not None:
        try:
            loaded = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except (OSError, yaml.YAMLError) as err:
            raise InjectError(f"--values: {path}: {' '.join(str(err).split())}") from None
        if not isinstance(loaded, dict):
            raise InjectError(f"--values: {path} is not a mapping of the chart's values")
        user = loaded
    if args.gpu is not None or "mode" not in user:
        user["mode"] = "sidecar" if args.gpu == "all" else "dcgm"
    if args.image:
        repository, _, tag = args.image.rpartition(":")
        if not repository or "/" in tag:
            repository, tag = args.image, ""
        user.setdefault("image", {}).update({"repository": repository, "tag": tag})
    try:
        return Values.of(user)
    except ValuesError as err:
        raise InjectError(str(err)) from None


def parser() -> ArgumentParser:
    p = ArgumentParser(
        prog=PROG,
        description="Add the exporter sidecar to the pod templates of Kubernetes manifests "
        "(workloads, KServe, LeaderWorkerSet, NIMService, DynamoGraphDeployment), as the "
        "chart's named template and the admission webhook build it.",
    )
    p.add_argument("files", nargs="*", default=["-"], metavar="FILE", help="'-': stdin.")
    p.add_argument("--values", type=Path, default=None, help="The chart's values (YAML).")
    p.add_argument("--image", default="", help="Exporter image (default: the chart's).")
    p.add_argument("--engine-url", default=None, help="The engine's metrics URL (default: found).")
    p.add_argument(
        "--gpu",
        choices=("none", "all"),
        default=None,
        help="none: no NVML (GPUs from the node agent or dcgm-exporter; the default); all: "
        "the sidecar reads every GPU it is given.",
    )
    native = p.add_mutually_exclusive_group()
    native.add_argument("--native-sidecar", dest="native", action="store_const", const=True)
    native.add_argument("--no-native-sidecar", dest="native", action="store_const", const=False)
    p.add_argument(
        "--kube-version",
        default="",
        help="The cluster's version: from 1.29 the sidecar is a native one.",
    )
    out = p.add_mutually_exclusive_group()
    out.add_argument("--in-place", action="store_true", help="Write back to the files.")
    out.add_argument("--dry-run", action="store_true", help="Print a unified diff only.")
    return p


def _slashed(name: str) -> str:
    return name if name.startswith("/") else "/" + name


def _write(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(tmp, path.stat().st_mode & 0o7777)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def run(argv: Sequence[str]) -> int:
    args = parser().parse_args(list(argv))
    if args.in_place and "-" in args.files:
        _fail("--in-place needs files, not stdin")
    try:
        values = _values(args.values, args)
        native = args.native if args.native is not None else native_default(args.kube_version)
        if native and args.kube_version and not native_default(args.kube_version):
            raise InjectError(
                f"--native-sidecar needs Kubernetes >= 1.29, --kube-version is {args.kube_version}"
            )
        options = Options(native=native or values.native, engine_url=args.engine_url)
        results = []
        outcome = Outcome()
        for name in args.files:
            source = read_source(name)
            text, found = inject_source(source, values, options)
            outcome.add(found)
            results.append((source, text, found.notes))
    except (InjectError, ValuesError) as err:
        _fail(str(err))
    if outcome.placed == 0:
        _fail(nothing_placed(outcome))
    for _, _, notes in results:
        for note in notes:
            print(f"{PROG}: {note}", file=sys.stderr)
    if args.in_place:
        for source, text, _ in results:
            if source.path is not None and text != source.text:
                _write(source.path, text)
        return 0
    try:
        _print(results, diff=args.dry_run)
    except BrokenPipeError:  # `inject ... | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


def _print(results: list[tuple[Source, str, list[str]]], *, diff: bool) -> None:
    if diff:
        for source, text, _ in results:
            sys.stdout.writelines(
                difflib.unified_diff(
                    source.text.splitlines(keepends=True),
                    text.splitlines(keepends=True),
                    "a" + _slashed(source.name),
                    "b" + _slashed(source.name),
                )
            )
        sys.stdout.flush()
        return
    for number, (_, text, _) in enumerate(results):
        if number and not text.startswith("---"):
            sys.stdout.write("---\n")
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
    sys.stdout.flush()
