"""One logging format for every Boss process."""

from __future__ import annotations

import logging
import os


def configure_logging(default_level: str = "INFO") -> None:
    """Logs to stderr at BOSS_LOG_LEVEL (default INFO): time, level, logger, message."""
    logging.basicConfig(
        level=os.environ.get("BOSS_LOG_LEVEL", default_level).upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
