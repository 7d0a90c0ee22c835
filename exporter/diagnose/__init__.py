"""exporter/diagnose"""
