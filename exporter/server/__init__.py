"""exporter/server"""
