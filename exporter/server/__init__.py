"""The HTTP side of the sidecar: the app, scrape coordination, exposition and web security."""
