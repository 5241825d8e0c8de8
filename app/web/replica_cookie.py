"""The replica that served a browser's page, named in a cookie: the proxy in front of several replicas routes the
browser's next requests back to it (deploy/nginx_config.py), and another replica that gets one of them (the first
stopped) tells the tab to reload, rather than answering from an empty context (handlers.py).

The cookie is set on the page itself (a GET of the root), which is what a reload fetches first.
"""

from __future__ import annotations

from urllib.parse import quote

REPLICA_COOKIE = "lminfinite_replica"  # nginx reads it as $cookie_lminfinite_replica: no dash in the name


def cookie_value(replica: str) -> str:
    """``replica`` as the cookie (and the proxy's map of it) writes it."""
    return quote(replica, safe="")


class ReplicaCookie:
    """ASGI middleware: a page load's response names this replica."""

    def __init__(self, app, replica: str):
        self.app = app
        self.header = (b"set-cookie",
                       f"{REPLICA_COOKIE}={cookie_value(replica)}; Path=/; HttpOnly; SameSite=Lax".encode("latin-1"))

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "GET" or scope["path"] not in ("/", ""):
            await self.app(scope, receive, send)
            return

        async def send_with_cookie(message):
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), self.header]}
            await send(message)

        await self.app(scope, receive, send_with_cookie)


def served_elsewhere(request, replica: str) -> str | None:
    """The replica named by ``request``'s cookie when it is not ``replica`` (its page came from there), else None."""
    cookies = getattr(request, "cookies", None) or {}
    try:
        named = cookies.get(REPLICA_COOKIE)
    except AttributeError:
        return None
    return named if named and named != cookie_value(replica) else None
