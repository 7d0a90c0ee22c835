"""Backends: NVML (the real library or a replayed trace), procfs, host PIDs and bounded HTTP.

They know nothing of Prometheus: collectors turn what they read into metrics.
"""
