"""exporter/tools"""
