"""The sidecar into pods the user does not own: one builder, three ways in.

:mod:`.sidecar` builds the exporter container from the chart's values (the chart's named
template renders the same; a test compares them); :mod:`.endpoint` finds the engine container and
its metrics URL; :mod:`.places` knows where each kind keeps its pod templates; :mod:`.patch`
plans the JSON Patch that adds the sidecar, which ``inject`` (:mod:`.cli`) applies to manifests
and the admission webhook (:mod:`.webhook`) returns to the API server.
"""
