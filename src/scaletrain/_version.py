"""Version of scaletrain (single source of truth, read by pyproject)."""

__version__ = "0.1.0"
