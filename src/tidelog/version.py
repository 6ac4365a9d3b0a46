"""tidelog's version, in a module of its own so that every layer may read it without importing
the package's lazy client exports (tidelog/__init__.py)."""

__version__ = "0.1.0"
