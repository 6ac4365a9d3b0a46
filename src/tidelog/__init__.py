"""tidelog: a replicated, segmented commit log with a high-water mark and a low-water mark."""

from tidelog.errors import TidelogError

__all__ = ["TidelogError"]
__version__ = "0.1.0"
