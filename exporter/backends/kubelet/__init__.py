"""The kubelet's PodResources v1 protocol: the vendored ``.proto`` and the message modules
grpcio-tools generates from it (``build-tools/protos.py``; never edited by hand)."""
