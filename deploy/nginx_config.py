"""Write the nginx configuration that puts several replicas of the app behind one address (docs/deploy.md).

    python deploy/nginx_config.py --listen 80 --max-file-size 200MB a=10.0.0.5:7860 b=10.0.0.6:7860 \
        > /etc/nginx/conf.d/lminfinite-chat.conf

Each ``NAME=HOST:PORT`` is a replica started with ``--replica NAME`` on that address, all with one shared
``--workspaces`` folder. What the configuration does:

- **Sticky by replica.** A page load's response names its replica in a cookie (app/web/replica_cookie.py); the
  browser's later requests go to that replica, where its tab's context lives. A browser without the cookie goes to
  the replica with the fewest connections.
- **Failover.** When a browser's replica does not answer (stopped, crashed), the request goes to another; the
  page's next load there reopens the workspace from the shared folder (leases: app/session/workspace_lease.py).
  The new replica names itself in the cookie, so the browser stays there when the first comes back.
- **Streaming.** Answers stream as server-sent events and Gradio may upgrade to WebSockets: no buffering, HTTP/1.1
  with the Upgrade headers passed, and long read timeouts (a long document's reading streams for minutes).
- **Uploads.** ``client_max_body_size`` is ``--max-upload``: one drop of several files is one request; the app
  itself refuses any file over its ``--max-file-size``, saying so.
- **TLS** with ``--tls-cert``/``--tls-key`` (plain HTTP on ``--listen`` otherwise; put it behind TLS before
  using ``--auth``, whose passwords it carries).

``--standalone PREFIX`` writes a whole nginx.conf (events, http, pid and logs under PREFIX), for an nginx of
its own (``nginx -p PREFIX -c PREFIX/nginx.conf``), as the tests run it.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from app.web.replica_cookie import REPLICA_COOKIE, cookie_value  # noqa: E402
from ingest.units import parse_size  # noqa: E402

_NAME = re.compile(r"[A-Za-z0-9._:-]{1,64}")
_ADDRESS = re.compile(r"[A-Za-z0-9.\-\[\]:]+:\d{1,5}")
FAILOVER_AFTER_S = 5  # a replica that refused a connection is skipped this long before it is tried again


def parse_replica(text: str) -> tuple[str, str]:
    name, sep, address = text.partition("=")
    if not sep or not _NAME.fullmatch(name) or not _ADDRESS.fullmatch(address):
        raise argparse.ArgumentTypeError(f"expected NAME=HOST:PORT (NAME as --replica of that server), got {text!r}")
    return name, address


def _pool(name: str) -> str:
    return "lminfinite_" + re.sub(r"[^A-Za-z0-9_]", "_", name)


def upstreams(replicas: list[tuple[str, str]]) -> str:
    """One group per replica (itself first, the others as backups), and one for browsers new to the site."""
    blocks = []
    for name, address in replicas:
        servers = [f"    server {address} max_fails=1 fail_timeout={FAILOVER_AFTER_S}s;"]
        servers += [f"    server {other} backup;" for _, other in replicas if other != address]
        blocks.append(f"upstream {_pool(name)} {{\n" + "\n".join(servers) + "\n}")
    everyone = "\n".join(f"    server {address} max_fails=1 fail_timeout={FAILOVER_AFTER_S}s;" for _, address in replicas)
    blocks.append(f"upstream lminfinite_any {{\n    least_conn;\n{everyone}\n}}")
    cookie = "\n".join(f'    "{cookie_value(name)}" {_pool(name)};' for name, _ in replicas)
    blocks.append(f"map $cookie_{REPLICA_COOKIE} $lminfinite_pool {{\n    default lminfinite_any;\n{cookie}\n}}")
    blocks.append("map $http_upgrade $lminfinite_connection {\n    default upgrade;\n    '' close;\n}")
    return "\n\n".join(blocks)


def server(listen: str, max_upload: int, tls: tuple[str, str] | None) -> str:
    listening = f"    listen {listen} ssl;\n    ssl_certificate {tls[0]};\n    ssl_certificate_key {tls[1]};" if tls \
        else f"    listen {listen};"
    return f"""server {{
{listening}
    client_max_body_size {max_upload};

    location / {{
        proxy_pass http://$lminfinite_pool;
        proxy_http_version 1.1;
        proxy_set_header Upgrade $http_upgrade;
        proxy_set_header Connection $lminfinite_connection;
        proxy_set_header Host $http_host;
        proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
        proxy_set_header X-Forwarded-Proto $scheme;
        proxy_set_header X-Forwarded-Host $http_host;
        proxy_buffering off;
        proxy_cache off;
        proxy_request_buffering off;
        proxy_read_timeout 1h;
        proxy_send_timeout 1h;
        proxy_next_upstream error timeout http_502 http_503;
        proxy_next_upstream_tries 3;
        add_header X-Replica $upstream_addr always;
    }}
}}"""


def render(replicas: list[tuple[str, str]], listen: str, max_upload: int, tls: tuple[str, str] | None = None) -> str:
    names = [name for name, _ in replicas]
    if not replicas or len(set(names)) != len(names):
        raise ValueError("give each replica once, with a name of its own")
    header = "# Written by deploy/nginx_config.py: replicas of lminfinite-chat sharing one workspace folder.\n"
    return header + upstreams(replicas) + "\n\n" + server(listen, max_upload, tls) + "\n"


def standalone(http: str, prefix: Path) -> str:
    """A whole nginx.conf around ``http``, everything it writes under ``prefix`` (no root needed)."""
    return f"""daemon off;
pid {prefix}/nginx.pid;
error_log {prefix}/error.log info;
events {{ worker_connections 256; }}
http {{
    access_log {prefix}/access.log;
    client_body_temp_path {prefix}/body;
    proxy_temp_path {prefix}/proxy;
    fastcgi_temp_path {prefix}/fastcgi;
    uwsgi_temp_path {prefix}/uwsgi;
    scgi_temp_path {prefix}/scgi;
{http}
}}
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("replicas", nargs="+", type=parse_replica, metavar="NAME=HOST:PORT")
    parser.add_argument("--listen", default="80", help="nginx's address and port, e.g. 443 or 0.0.0.0:8080")
    parser.add_argument("--max-file-size", type=parse_size, default=parse_size("200MB"),
                        help="the replicas' --max-file-size (default 200MB)")
    parser.add_argument("--max-upload", type=parse_size, default=None,
                        help="largest upload request, several files at once (default: 10 x --max-file-size)")
    parser.add_argument("--tls-cert", help="certificate (PEM) for TLS on --listen")
    parser.add_argument("--tls-key", help="its private key")
    parser.add_argument("--standalone", type=Path, metavar="PREFIX", help="write a whole nginx.conf using PREFIX")
    args = parser.parse_args(argv)
    if bool(args.tls_cert) != bool(args.tls_key):
        parser.error("--tls-cert and --tls-key go together")
    text = render(args.replicas, args.listen, args.max_upload or 10 * args.max_file_size,
                  (args.tls_cert, args.tls_key) if args.tls_cert else None)
    print(standalone(text, args.standalone.resolve()) if args.standalone else text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
