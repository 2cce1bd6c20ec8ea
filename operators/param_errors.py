"""One-line answers to a trigger with a bad Param, instead of Airflow's raw JSON-schema dump.

Airflow answers ``POST /api/v2/dags/{dag_id}/dagRuns`` (the UI's trigger form and REST) with
``Invalid input for param X: <jsonschema error>``, and jsonschema's error text carries the whole schema and the
instance over a dozen lines.  This ASGI middleware (registered by the plugin as a FastAPI root middleware) keeps the
first line of such a 400, and for a Param with a pattern says which characters it allows (:data:`HINTS`).  Every
other request and response passes through untouched.
"""

from __future__ import annotations

import json
import re

from operators.params import RUN_ID_RULE

TRIGGER = re.compile(r"/dags/[^/]+/dagRuns/?$")
PREFIX = "Invalid input for param "
#: What a Param with a ``pattern`` accepts, in words (the pattern itself is no help to a user).
HINTS = {"corpus_run": RUN_ID_RULE}


def one_line(detail: str) -> str:
    """The first line of a Param error; a pattern mismatch of a known Param says what it allows instead."""
    first = detail.strip().splitlines()[0] if detail.strip() else detail
    m = re.match(re.escape(PREFIX) + r"(\w+): (.*) does not match ", first)
    if m and m.group(1) in HINTS:
        return f"{PREFIX}{m.group(1)}: {m.group(2)} is not allowed; {HINTS[m.group(1)]}"
    return first


def _rewrite(body: bytes) -> bytes:
    try:
        payload = json.loads(body)
    except ValueError:
        return body
    detail = payload.get("detail") if isinstance(payload, dict) else None
    if not isinstance(detail, str) or not detail.startswith(PREFIX):
        return body
    return json.dumps({**payload, "detail": one_line(detail)}).encode()


class OneLineParamErrors:
    """ASGI middleware: shorten the 400 of a trigger request with a bad Param to one line."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope.get("method") != "POST" or not TRIGGER.search(scope.get("path", "")):
            await self.app(scope, receive, send)
            return
        start: dict | None = None
        passthrough = False
        chunks: list[bytes] = []

        async def capture(message):
            nonlocal start, passthrough
            if message["type"] == "http.response.start":
                if message["status"] != 400:
                    passthrough = True
                    await send(message)
                else:
                    start = message
                return
            if passthrough or message["type"] != "http.response.body":
                await send(message)
                return
            chunks.append(message.get("body", b""))
            if message.get("more_body"):
                return
            body = _rewrite(b"".join(chunks))
            headers = [(k, v) for k, v in start["headers"] if k.lower() != b"content-length"]
            await send({**start, "headers": [*headers, (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})

        await self.app(scope, receive, capture)
