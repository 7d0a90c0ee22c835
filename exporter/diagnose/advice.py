"""The scaling advice of a diagnosis: per target, what to do and why, from the signatures that
hold and what each means for scaling (:class:`~exporter.signatures.definitions.Advice`).

The same rule as the pack's ``scale_out_eligible`` gate (``docs/slo.md``): where a signature
that blocks scaling out holds (host-side, link, stall, GPU), adding replicas would not help and
the advice is the fix it names, with its reason in its own numbers ("scaling out would not
help: the engine's front-end thread is at 98 % of a core ..."); where only capacity signatures
hold (a queue that dominates latency, a full KV cache, saturated HBM), scale out. A target
where only the pack's blind spots hold is said to be unseen, not advised.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from exporter.diagnose.findings import Finding, explainer
from exporter.signatures.definitions import fill_placeholders


@dataclass(frozen=True)
class ScalingAdvice:
    """What to do about one target, and the findings that say so (in rank order)."""

    target: str
    action: str
    blocks_scale_out: bool
    cause: str
    why: str
    also: tuple[str, ...] = ()
    #: Where the cause holds when it is another target's (the gateway of an engine's pool).
    cause_target: str = ""

    def text(self) -> str:
        """One line: the action and its reason."""
        cause = f"{self.cause} on {self.cause_target}" if self.cause_target else self.cause
        if self.action == "scale_out":
            return f"scale out: {self.why} ({cause})"
        if self.blocks_scale_out:
            lead = f"{self.action}; scaling out would not help: {self.why} ({cause})"
        else:
            lead = f"{self.action}: {self.why} ({cause})"
        if self.also:
            lead += f"; also {', '.join(self.also)}"
        return lead

    def as_json(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "action": self.action,
            "blocks_scale_out": self.blocks_scale_out,
            "cause": self.cause,
            "cause_target": self.cause_target or self.target,
            "why": self.why,
            "also": list(self.also),
            "text": self.text(),
        }


def why(finding: Finding) -> str:
    """The finding's advice sentence with its own evidence and labels filled in."""
    values = {f"labels.{k}": v for k, v in finding.instance.labels}
    values.update({e.key: e.text for e in finding.evidence})
    return fill_placeholders(finding.sig.advice.why, values)


def scaling_advice(findings: list[Finding]) -> list[ScalingAdvice]:
    """Per target with a signature that holds, in the order of the first finding of each: the
    highest-ranked blocking signature's fix, else scale out for a capacity signature, else the
    pack's blind spot. A cause counts on the targets it covers as on its own (a gateway's on
    the engines of its pool), and a finding it explains there is its consequence, not a second
    cause: the engines behind a gateway gating on stale metrics are told to fix its scrape,
    not their CPU side, as the pack's advice records say."""
    by_target: dict[str, list[Finding]] = {}
    for finding in findings:
        if finding.instance.holds and explainer(finding, findings) is None:
            for target in dict.fromkeys((finding.target, *finding.covers)):
                by_target.setdefault(target, []).append(finding)
    out = []
    for target, held in by_target.items():
        blocking = [f for f in held if f.sig.advice.blocks_scale_out]
        capacity = [f for f in held if f.sig.advice.action == "scale_out"]
        lead = (blocking or capacity or held)[0]
        others = tuple(
            dict.fromkeys(
                f"{f.sig.advice.action} ({f.sig.alert})"
                for f in (blocking or capacity or held)[1:]
                if f.sig.alert != lead.sig.alert
            )
        )
        out.append(
            ScalingAdvice(
                target=target,
                action=lead.sig.advice.action,
                blocks_scale_out=lead.sig.advice.blocks_scale_out,
                cause=lead.sig.alert,
                why=why(lead),
                also=others,
                cause_target="" if lead.target == target else lead.target,
            )
        )
    return out
