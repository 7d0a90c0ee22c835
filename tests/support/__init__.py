"""Test support: paths, the CLI process, metric readers, fakes (NVML, engine), the one
Prometheus and Alertmanager launcher. Imported by tests as ``support.<module>``."""
