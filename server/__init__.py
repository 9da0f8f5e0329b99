"""gradwatch's server: ingest, storage, live fan-out, history API, reports, CLI.

Importing this package is light (no fastapi); ``gradwatch.server.app`` holds the
FastAPI application factory.
"""
