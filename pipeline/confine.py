"""Confined paths: every file a run reads or serves lies under a root the deployment declared.

Why: whoever can trigger a DAG (or post an Asset event) must not be able to make the workers read an arbitrary
file into the corpus, the rejects or the reports.  The deployment declares the allowed roots in
``MINDLOOM_ALLOWED_ROOTS`` (comma-separated local folders and ``s3://bucket/prefix`` style URIs); without
it the roots are the config's ``data_root`` and the folder of the config file.  A local path is resolved first
(``..`` and every symlink), so a link inside a root that points outside is refused too; a URI must start with an
allowed URI root, segment by segment, and may not contain ``..``.  A refused path raises :class:`PathNotAllowed`,
which names the field and the roots.  Callers read the path :func:`check_path` returns (resolved, every symlink
followed), never the raw one they passed: a link swapped between the check and the open cannot redirect the read.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from pipeline.configkit import ConfigError

ENV = "MINDLOOM_ALLOWED_ROOTS"


class PathNotAllowed(ConfigError):
    """A path outside every allowed root; the message names the field and the roots."""


def _is_uri(path: str) -> bool:
    return "://" in path and not path.startswith("file://")


def _normal_root(root: str) -> str:
    if _is_uri(root):
        return root.rstrip("/") + "/"
    return os.path.realpath(root.removeprefix("file://"))


def allowed_roots(data_root: str | Path, config_path: str | Path | None = None) -> list[str]:
    """The declared roots (``$MINDLOOM_ALLOWED_ROOTS``), else ``data_root`` and the config file's folder."""
    declared = [r for r in os.environ.get(ENV, "").split(",") if r.strip()]
    if declared:
        return [_normal_root(r.strip()) for r in declared]
    roots = [_normal_root(str(data_root))]
    if config_path:
        roots.append(_normal_root(str(Path(config_path).parent)))
    return roots


def check_path(path: str | Path, roots: Iterable[str], field: str) -> str:
    """``path`` resolved (local) or normalised (URI) when it lies under one of ``roots``; else PathNotAllowed."""
    roots = list(roots)
    text = str(path)
    if _is_uri(text):
        scheme_rest = text.split("://", 1)[1]
        ok = ".." not in scheme_rest.split("/") and any(
            r.endswith("/") and _is_uri(r) and (text.rstrip("/") + "/").startswith(r) for r in roots)
        resolved = text
    else:
        resolved = os.path.realpath(text.removeprefix("file://"))
        ok = any(not _is_uri(r) and (resolved == r or resolved.startswith(r.rstrip(os.sep) + os.sep))
                 for r in roots)
    if not ok:
        shown = text if resolved == text else f"{text} (resolves to {resolved})"
        raise PathNotAllowed(f"{field}: {shown} is outside the allowed roots {roots}; the deployment declares "
                             f"them in ${ENV}")
    return resolved


def static_root(pattern: str) -> str:
    """The part of a glob pattern before its first wildcard: the folder a listing starts from."""
    cut = min((i for i, ch in enumerate(pattern) if ch in "*?["), default=len(pattern))
    head = pattern[:cut]
    return head if cut == len(pattern) else head.rsplit("/", 1)[0] or "/"
