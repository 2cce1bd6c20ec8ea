"""Sources whose paths match no file: caught at plan time, not three stages later in the tokenizer.

A source whose every pattern lists nothing (no such file, no glob match, an empty folder, no file with the
reader's suffix) would otherwise ingest zero documents and let the run fail much later with "no documents left
after filtering".  :func:`check_source` raises a :class:`ConfigError` naming the source and each pattern, unless
the source says ``allow_empty: true``; then it is left out of the plan and listed in the run summary instead.
A pattern that matches nothing inside a source whose other patterns match stays a ``missing_path`` reject.
"""

from __future__ import annotations

import logging

from pipeline.configkit import ConfigError
from pipeline.ingest.config import SourceConfig

log = logging.getLogger(__name__)

#: problems that mean "this pattern names no file" (as opposed to a file that exists but cannot be read)
NOTHING = {("missing_path", None), ("empty_file", "folder holds no files")}


def _names_nothing(unit: dict) -> bool:
    problem = unit.get("problem")
    return bool(problem) and ((problem[0], None) in NOTHING or tuple(problem) in NOTHING)


def matches_nothing(units: list[dict]) -> bool:
    """True when the planned units of one source hold no file to read, only 'nothing here' problems."""
    return all(_names_nothing(u) for u in units)


def check_source(index: int, name: str, src: SourceConfig, units: list[dict]) -> dict | None:
    """None when the source matched files; else raise, or (``allow_empty``) return its summary entry."""
    if not matches_nothing(units):
        return None
    why = {u["path"]: u["problem"][1] for u in units}
    patterns = "; ".join(f"{p!r} ({why.get(p, 'no file matches this pattern')})" for p in src.paths)
    if not src.allow_empty:
        raise ConfigError(f"sources[{index}] {name!r} ({src.reader}): its paths match no file: {patterns}. "
                          "Fix 'paths', or set 'allow_empty: true' on this source to run without it")
    log.warning("source %s matches no file (allow_empty): %s", name, patterns)
    return {"source": name, "domain": src.domain, "reader": src.reader, "paths": list(src.paths),
            "detail": patterns}
