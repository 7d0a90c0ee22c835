"""The lab: reference engine, load generator, demo (an optional extra, never in the image)."""
