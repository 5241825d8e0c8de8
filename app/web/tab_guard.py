"""With --auth, a tab's session hash answers only the login that first used it, on Gradio's own routes too.

Gradio takes the session hash a client sends on trust. The app's events check the request's user against the
session's owner (handlers.py, registry.py), but Gradio's routes that carry a hash check at most that someone
is logged in (and /cancel and the heartbeat not even that): another user who learns a tab's hash could read
its queue stream (its questions and answers), break that stream, cancel its events, or open and drop a
heartbeat for it (which closes the tab's running events), before any event function of the app runs.

``TabOwnerGuard`` is an ASGI middleware given to FastAPI through ``launch(app_kwargs=...)``: each hash is bound to
the login token (Gradio's ``access-token`` cookie) of the first request that uses it with one, and a request
for a bound hash with another token, or none, is answered 403 before Gradio sees it.
"""

from __future__ import annotations

import json
from collections import OrderedDict

from starlette.requests import HTTPConnection
from starlette.responses import JSONResponse

from . import messages

API = "/gradio_api/"
TOKEN_COOKIE = "access-token"  # Gradio's login cookies: access-token-<id> and access-token-unsecure-<id>
HASHES_KEPT = 100_000  # tabs remembered (the least recently used forgotten first): bounded memory
FORBIDDEN = 403


class TabLogins:
    """Which login each session hash belongs to. Used on the server's event loop only."""

    def __init__(self, kept: int = HASHES_KEPT):
        self._logins: OrderedDict[str, frozenset[str]] = OrderedDict()
        self._kept = kept

    def allows(self, session_hash: str, tokens: frozenset[str]) -> bool:
        """Whether a request with login ``tokens`` may use ``session_hash``; the first with a login binds it."""
        bound = self._logins.get(session_hash)
        if bound is None:
            if tokens:
                self._logins[session_hash] = tokens
                while len(self._logins) > self._kept:
                    self._logins.popitem(last=False)
            return True
        if not bound & tokens:
            return False
        self._logins.move_to_end(session_hash)
        return True


def login_tokens(connection: HTTPConnection) -> frozenset[str]:
    return frozenset(value for name, value in connection.cookies.items() if name.startswith(TOKEN_COOKIE) and value)


def hash_in_path(connection: HTTPConnection) -> str | None:
    """The session hash of a GET route that takes it in its path or query (the heartbeat, media streams, the
    queue's data stream)."""
    if connection.query_params.get("session_hash"):
        return connection.query_params["session_hash"]
    route = connection.url.path.partition(API)[2].split("/")
    if route[0] == "heartbeat" and len(route) == 2:
        return route[1]
    if route[0] == "stream" and len(route) >= 4:  # stream/{session_hash}/{run}/...; POST stream/{event_id} has 2
        return route[1]
    return None


def hash_in_body(body: bytes) -> str | None:
    """The ``session_hash`` of a JSON request body (queue/join, cancel, call)."""
    try:
        data = json.loads(body)
    except ValueError:
        return None
    found = data.get("session_hash") if isinstance(data, dict) else None
    return found if isinstance(found, str) and found else None


class TabOwnerGuard:
    """403 for a request that names a session hash bound to another login (see the module's docstring)."""

    def __init__(self, app, logins: TabLogins | None = None):
        self.app = app
        self.logins = logins or TabLogins()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or API not in scope["path"]:
            await self.app(scope, receive, send)
            return
        connection = HTTPConnection(scope)
        session_hash = hash_in_path(connection)
        if session_hash is None and scope["method"] == "POST" and _is_json(connection):
            body = await _read_body(receive)
            session_hash = hash_in_body(body)
            receive = _replay(body, receive)
        if session_hash is not None and not self.logins.allows(session_hash, login_tokens(connection)):
            refusal = JSONResponse({"detail": messages.ANOTHER_USERS_SESSION}, status_code=FORBIDDEN)
            await refusal(scope, receive, send)
            return
        await self.app(scope, receive, send)


def _is_json(connection: HTTPConnection) -> bool:
    return connection.headers.get("content-type", "").split(";")[0].strip() == "application/json"


async def _read_body(receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        if message["type"] != "http.request":  # the client left: Gradio sees an empty body
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            break
    return b"".join(chunks)


def _replay(body: bytes, receive):
    """A ``receive`` that gives the app the body already read, then what the client sends next (its leaving)."""
    sent = False

    async def replayed():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed
