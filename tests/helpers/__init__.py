"""Shared test helpers (on sys.path through pytests ``pythonpath``)."""
