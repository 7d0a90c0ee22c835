#!/bin/sh
# Recipe: a Helm post-renderer that adds the exporter sidecar to what vLLM production-stack's chart
# (or any chart) renders: helm install vllm vllm/vllm-stack \
#   -f values.yaml --post-renderer ./post-renderer.sh
# Each model's engine Deployment gets the sidecar; the router and
# everything else pass through unchanged. IBE_VALUES: this exporter chart's values file
# (examples/llm-d/ibe-values.yaml). Helm 3; Helm 4 takes post-renderers as plugins.
exec inference-bottleneck-exporter inject ${IBE_VALUES:+--values "$IBE_VALUES"} -
