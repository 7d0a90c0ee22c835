"""``inference-bottleneck-exporter diagnose``: which bottleneck signatures hold right now.

Two sources, one verdict:

``--prometheus.url URL``
    evaluates the catalogue's alert expressions and evidence through the Prometheus HTTP API
    (``/api/v1/query``). The Prometheus must hold the pack's recording rules for the same
    profile and site config (``--profile``, ``--config``); the alerts' ``ALERTS`` state is
    shown when the alerting rules are loaded too.
``--target URL``
    no Prometheus: samples the sidecar's ``/metrics`` every ``--interval`` over
    ``--duration`` and evaluates the pack's recording rules and alert expressions itself
    (:mod:`exporter.diagnose.promql_eval`): rates, ratios, derivatives and histogram medians come
    from the samples, every window is the sampling span. Signatures that compare with the
    past (the HBM signature's 1h baseline) need Prometheus history and are listed as such.

Each alert expression is split at its ``and``/``or``/``unless`` into conditions; every
comparison is measured against its threshold. A signature *holds* when its expression would
return the instance now (``for`` not considered: the text says how long the alert waits),
and *nearly holds* when every condition that fails misses its threshold by at most
``--nearly`` (default 10 %) of the threshold. The verdict lists what holds first
(critical before warning before info, then the clearest margin), then what nearly holds
(closest first), with the evidence numbers, the alert's own summary and description, and the
runbook link.

Under the verdict, per served model: the roofline figures and the latency budget from the
pack's records (``docs/roofline.md``) - how far decode is from its HBM floor, tokens/s against
the roofline's at the current batch, the prefill compute efficiency, the shares of end-to-end
latency in queue, prefill, decode and on the host - and the workload shape (mean prompt and
output tokens per request, the prefill/decode split) with the rule of thumb for disaggregated
serving: advice, not a signature.

Exit codes: 0 nothing holds, 1 at least one signature holds, 2 usage, configuration or
connection error (one line on stderr).

Modules: :mod:`~exporter.diagnose.cli` (flags, exit codes), :mod:`~exporter.diagnose.evaluate`
(conditions, evidence, ranking, the two modes), :mod:`~exporter.diagnose.datasources` (Prometheus
HTTP API, sidecar sampling), :mod:`~exporter.diagnose.promql_syntax` (the PromQL parser, with
source spans), :mod:`~exporter.diagnose.promql_eval` (the evaluator behind ``--target``),
:mod:`~exporter.diagnose.findings` (results), :mod:`~exporter.diagnose.report` (text and JSON),
:mod:`~exporter.diagnose.timeline` (the window's time series, ``--report`` with Prometheus) and
:mod:`~exporter.diagnose.postmortem` (``--report FILE.html`` or ``FILE.md``: the verdict, plots,
data quality and inputs as a post-mortem).
"""
