"""Structured JSON log lines. Context (request_id, trace_id, agent, decision) is attached with ``extra=``."""

from __future__ import annotations

import json
import logging

_STANDARD = set(vars(logging.makeLogRecord({})).keys()) | {"message", "asctime"}
_SECRET_KEYS = {"authorization", "password", "secret", "signature", "token", "key", "api_key"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key in _STANDARD or key.startswith("_"):
                continue
            entry[key] = "***" if key.lower() in _SECRET_KEYS else value
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str, ensure_ascii=False)
