"""fedload: gather the PostgreSQL data of many feeder hubs into one superhub database."""

__version__ = "0.1.0"

__all__ = ["__version__"]
