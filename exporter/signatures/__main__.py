"""``python -m exporter.signatures``: generate (or ``--check``) the rule pack and runbooks.

Without ``--profile`` it writes the whole shipped pack: ``<out>/recording_rules.yaml`` and
``<out>/alerts.yaml`` for the default ``sidecar`` profile, the same under ``<out>/dcgm/`` and
``<out>/fast/``, an example Alertmanager configuration ``<out>/alertmanager.yaml``, and one
runbook per alert under ``--runbooks``. With ``--profile P`` it writes
only that profile's two files into ``<out>`` (a site's own pack: ``--config site.yaml
--profile dcgm --out rules/``; the unshipped ``fast-node`` and ``fast-dcgm`` only so).
``--check`` writes nothing and exits 1 when a file differs.
Configuration errors print one line and exit 2.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from exporter.config import ArgumentParser
from exporter.signatures.alertmanager import alertmanager_yaml
from exporter.signatures.catalogue import all_signatures
from exporter.signatures.render import (
    GENERATOR,
    alerts_yaml,
    recording_rules_yaml,
    runbook_index,
    runbook_markdown,
    slo_runbook_markdown,
)
from exporter.signatures.site import (
    ALL_PROFILES,
    PROFILES,
    SignatureConfigError,
    SiteConfig,
    load_config,
)
from exporter.signatures.slo.burn_alerts import slo_alerts

ROOT = Path(__file__).resolve().parent.parent.parent
DEFAULT_OUT = ROOT / "alert_rules"
DEFAULT_RUNBOOKS = ROOT / "docs" / "runbooks"


def profile_files(cfg: SiteConfig, out: Path) -> dict[Path, str]:
    return {
        out / "recording_rules.yaml": recording_rules_yaml(cfg),
        out / "alerts.yaml": alerts_yaml(cfg),
    }


def runbook_files(cfg: SiteConfig, out: Path) -> dict[Path, str]:
    signatures = all_signatures(cfg)
    burns = slo_alerts(cfg, every_kind=True)
    files = {out / f"{sig.alert}.md": runbook_markdown(cfg, sig, signatures) for sig in signatures}
    files.update({out / f"{burn.alert}.md": slo_runbook_markdown(cfg, burn) for burn in burns})
    files[out / "README.md"] = runbook_index(cfg, signatures, burns)
    return files


def pack_files(cfg: SiteConfig, out: Path, runbooks: Path | None) -> dict[Path, str]:
    """Everything the full pack consists of, keyed by path."""
    files = profile_files(cfg.with_profile("sidecar"), out)
    files[out / "alertmanager.yaml"] = alertmanager_yaml(cfg.with_profile("sidecar"))
    for name in PROFILES:
        if name != "sidecar":
            files.update(profile_files(cfg.with_profile(name), out / name))
    if runbooks is not None:
        files.update(runbook_files(cfg.with_profile("sidecar"), runbooks))
    return files


def stale_runbooks(files: dict[Path, str], runbooks: Path | None) -> list[Path]:
    """Generated runbook pages of alerts that no longer exist."""
    if runbooks is None or not runbooks.is_dir():
        return []
    return sorted(
        path
        for path in runbooks.glob("*.md")
        if path not in files and GENERATOR in path.read_text(encoding="utf-8")
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = ArgumentParser(prog=GENERATOR, description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, help="site config (YAML); defaults when omitted")
    parser.add_argument(
        "--profile",
        choices=tuple(ALL_PROFILES),
        help="write only this profile's rules into --out (default: the whole pack; fast-node "
        "and fast-dcgm, which the demo and the drills load, only so)",
    )
    parser.add_argument("--out", type=Path, default=None, help=f"default {DEFAULT_OUT}")
    parser.add_argument(
        "--runbooks",
        type=Path,
        default=None,
        help=f"runbook directory (default {DEFAULT_RUNBOOKS} for the whole pack)",
    )
    parser.add_argument("--check", action="store_true", help="exit 1 if any file differs")
    args = parser.parse_args(argv)
    out: Path = args.out or DEFAULT_OUT
    runbooks: Path | None = args.runbooks if args.profile else args.runbooks or DEFAULT_RUNBOOKS
    try:
        # Every profile the pack holds is built here, so a config that one of them refuses
        # (e.g. dcgm's join labels) is reported like any other config error.
        cfg = load_config(args.config, args.profile or "sidecar")
        if args.profile:
            files = profile_files(cfg, out)
            if runbooks is not None:
                files.update(runbook_files(cfg, runbooks))
        else:
            files = pack_files(cfg, out, runbooks)
    except SignatureConfigError as err:
        where = (
            f"{args.config}: " if args.config and not str(err).startswith(str(args.config)) else ""
        )
        sys.stderr.write(f"{GENERATOR}: error: {where}{err}\n")
        return 2
    stale = stale_runbooks(files, runbooks)
    if args.check:
        bad = [
            path
            for path, text in files.items()
            if not path.is_file() or path.read_text(encoding="utf-8") != text
        ]
        for path in bad:
            sys.stderr.write(f"{path} is out of date: run {GENERATOR}\n")
        for path in stale:
            sys.stderr.write(f"{path} belongs to no alert of the catalogue: run {GENERATOR}\n")
        return 1 if bad or stale else 0
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
    for path in stale:
        path.unlink()
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
