#!/bin/sh
# Recipe: a Helm post-renderer that adds the exporter sidecar to what llm-d's modelservice chart
# (or any chart) renders: helm install ms llm-d-modelservice/llm-d-modelservice \
#   -f values.yaml --post-renderer ./post-renderer.sh
# The decode and prefill Deployments (or LeaderWorkerSets) get the sidecar; the routing proxy and
# everything else pass through unchanged. IBE_VALUES: this exporter chart's values file
# (examples/llm-d/ibe-values.yaml). Helm 3; Helm 4 takes post-renderers as plugins.
exec inference-bottleneck-exporter inject ${IBE_VALUES:+--values "$IBE_VALUES"} -
