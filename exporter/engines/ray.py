"""Ray Serve LLM: vLLM's metrics re-exported by Ray's metrics agent, ``ray_vllm_*``.

Source: vLLM's ``RayPrometheusStatLogger`` (``vllm/v1/metrics/ray_wrappers.py``) records
vLLM's own metrics through ``ray.util.metrics``; Ray's per-node metrics agent serves them with
its prefix ``ray_`` and its labels ``Component``, ``NodeAddress``, ``SessionName``,
``Version`` (Ray's), ``WorkerId`` and, since late 2025, ``ReplicaId``, next to vLLM's
``model_name`` (Ray Serve's ``model_id``) and ``engine``. Ray 2.32 kept vLLM's colon
(``ray_vllm:num_requests_waiting``); by Ray 2.52 it is an underscore
(``ray_vllm_num_requests_waiting``). Captured: a Ray 2.32 scrape (vLLM V0 names) and one line
of Ray 2.52.

Every normalised name is read as for vLLM (see :mod:`exporter.engines.vllm`), under both
spellings (underscore first), so the set of names follows the vLLM inside. Replicas
(``ReplicaId``, ``WorkerId``) serve distinct requests: their counts, counters and histograms
are summed per model, the KV usage is the fullest replica's, and none of Ray's labels reaches
the normalised series, so replicas coming and going never add series. The metrics agent port
is Ray's ``--metrics-export-port`` on each node: point one ``--engine.url`` at each node's
agent. The version in ``inference_engine_info`` is Ray's (the ``Version`` label).
"""

from __future__ import annotations

from exporter.engines import vllm
from exporter.engines.rules import renamed
from exporter.engines.spec import EngineSpec, Version

PREFIXES = ("ray_vllm_", "ray_vllm:")


def _spellings(name: str) -> tuple[str, ...]:
    """``vllm:x`` as Ray writes it now (``ray_vllm_x``) and as Ray 2.32 did (``ray_vllm:x``)."""
    rest = name.removeprefix(vllm.PREFIX)
    return ("ray_vllm_" + rest, "ray_vllm:" + rest)


SPEC = EngineSpec(
    name="ray",
    title="Ray Serve LLM",
    prefixes=PREFIXES,
    rules=renamed(vllm.RULES, _spellings),
    tokenize=None,
    preallocates_memory=True,
    process="ray::",
    version=Version(label="Version"),
)
