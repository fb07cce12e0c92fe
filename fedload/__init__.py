"""fedload: gather the PostgreSQL data of many feeder hubs into one superhub database."""

__version__ = "0.2.0"

__all__ = ["__version__"]
