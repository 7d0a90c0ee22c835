"""Service-level objectives and scaling advice, generated with the rest of the pack.

- :mod:`.slo_signals`: per objective (model and pool) the events that met it and all events,
  the SLI and the error budget's burn rate over each window of the burn-rate alerts, the
  budget left over the period, and goodput (``docs/slo.md``);
- :mod:`.verdict_signals`: which signatures hold on each pod and pool now, the scaling advice
  each one names (:class:`~exporter.signatures.definitions.Advice`), and the
  ``scale_out_eligible`` gate an autoscaler multiplies its trigger by;
- :mod:`.burn_alerts`: the multi-window, multi-burn-rate alerts of the Google SRE workbook,
  each page naming the signatures that hold on the pool's pods at that moment.

The records are written after the signals' (:func:`pack_recording_rules`); the alerts form
the rule group ``inference.slo``.
"""
