"""exporter/lab"""
