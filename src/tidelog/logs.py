"""Logs as text or as JSON lines (`--log-format json`), one object per record.

The events an operator acts on are logged with a name and their facts as fields (`event(...)`),
so that a log pipeline can select them without parsing sentences:

    leader_elected      a replica on this node became leader (topic, partition, epoch)
    leader_lost         it stopped leading (topic, partition, epoch)
    log_truncated       a follower cut its log back to agree with its leader (log_end_offset)
    recovered_truncated a log found torn at start was cut back to its last whole batch
    cursor_invalidated  a cursor no longer holds the log (cursor, reason)
    log_start_moved     the cleaner moved a log start up to the LWM (previous_log_start_offset,
                        log_start_offset, set_by)
    segments_deleted    segments below the log start were deleted (segments, bytes)
    storage_full        produce refused: storage.max.bytes reached, or the disk is full
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

EVENT_FIELD = "tidelog"  # where event() puts its facts on the LogRecord
FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def event(logger: logging.Logger, level: int, name: str, message: str, **facts: Any) -> None:
    """Log message (plain words, for the text format) as the event `name` with its facts."""
    if logger.isEnabledFor(level):
        logger.log(level, message, extra={EVENT_FIELD: {"event": name, **facts}})


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        facts = getattr(record, EVENT_FIELD, None)
        if isinstance(facts, dict):
            out.update(facts)
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def configure(level: str, log_format: str = "text") -> None:
    if log_format not in FORMATS:
        raise SystemExit(f"--log-format must be one of {', '.join(FORMATS)}, not {log_format!r}")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT)
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(getattr(logging, level.upper(), logging.WARNING))
