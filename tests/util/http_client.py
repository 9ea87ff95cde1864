"""One JSON request to a server the tests started (experiments/serve_router_process.py), with
http.client: (status, headers, decoded body)."""
from __future__ import annotations

import http.client
import json
import urllib.parse


def request(url: str, method: str, path: str, body: dict | None = None, *,
            bearer: str | None = None, timeout: float = 120.0) -> tuple[int, dict, object]:
  """`method path` on the server at `url`, with `body` as JSON and `bearer` as the API key when
  given; the body is decoded as JSON (None when empty)."""
  u = urllib.parse.urlsplit(url)
  conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
  headers = {"Content-Type": "application/json"} if body is not None else {}
  if bearer:
    headers["Authorization"] = f"Bearer {bearer}"
  try:
    conn.request(method, path, body=None if body is None else json.dumps(body), headers=headers)
    r = conn.getresponse()
    raw = r.read()
    return r.status, dict(r.getheaders()), json.loads(raw) if raw else None
  finally:
    conn.close()
