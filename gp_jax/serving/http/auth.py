"""API keys of a router server: the keys file, who a request is, and what each role may do.

Keys file (`--api_keys_file`), JSON:

  {"keys": [{"name": "alice", "sha256": "<hex SHA-256 of the key>", "role": "client"},
            {"name": "kiosk", "sha256": "...", "role": "client", "feedback": false},
            {"name": "ops",   "sha256": "...",                      "role": "admin"}]}

The file holds digests only, never the keys. A client sends its key as `Authorization: Bearer
<key>` (what the openai client sends for `api_key=`). The server hashes the presented key and
compares the digest with every stored digest in constant time (hmac.compare_digest, no early
exit), so the time of a refusal does not tell how much of a digest matched.

Roles:
  client  /v1/models, /v1/chat/completions, and /v1/feedback on its own completions only
          (feedback on another key's completion is answered exactly as an unknown id, 404, so
          completion ids cannot be probed); `"feedback": false` (default true) makes a chat-only
          key: its feedback is refused with 403 and reaches neither the memory nor the learner;
  admin   everything: also /v1/routes, /v1/memory, /metrics, /v1/router/*, feedback on any
          completion and the details of /health.
/health answers everyone (load balancers probe it without a key), but says only up or down
(`{"status": "ok"}`, or 503 `{"status": "down"}`) unless the caller is an admin.

Without a keys file every request is the anonymous admin, and the server refuses to bind any
address but loopback, or to answer any Host name but loopback ones (`check_bind`).

The server re-reads the keys file on SIGHUP and when the file changes (gate.Gate.follow_keys);
`load` is what it runs, so a reload checks exactly what a start checks.
"""
from __future__ import annotations

import dataclasses
import hashlib
import hmac
import ipaddress
import os
import re

from gp_jax import errors

CLIENT, ADMIN = "client", "admin"
ROLES = (CLIENT, ADMIN)
_HEX64 = re.compile(r"[0-9a-fA-F]{64}")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}")
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1", "[::1]")


@dataclasses.dataclass(frozen=True)
class Principal:
  """Who sent a request. name: the key's name (None: no keys file, anyone on loopback);
  feedback: whether it may send feedback at all (a keys-file entry's `"feedback"`)."""
  name: str | None
  role: str
  feedback: bool = True

  @property
  def is_admin(self) -> bool:
    return self.role == ADMIN


ANONYMOUS = Principal(None, ADMIN)


@dataclasses.dataclass(frozen=True)
class _Key:
  name: str
  digest: bytes
  role: str
  feedback: bool


def key_digest(key: str) -> str:
  """The hex SHA-256 of a key, as the keys file stores it."""
  return hashlib.sha256(key.encode("utf-8")).hexdigest()


def file_stamp(path) -> tuple | None:
  """What tells a changed file from the same one: (mtime_ns, size, inode); None: no such file."""
  try:
    st = os.stat(path)
  except OSError:
    return None
  return st.st_mtime_ns, st.st_size, st.st_ino


class KeyRing:
  """The keys of one keys file (`load`).

  path: that file (None: keys made in memory); stamp: its file_stamp just before it was read.
  """

  def __init__(self, keys: list[_Key], path=None, stamp=None):
    self._keys = tuple(keys)
    self.path, self.stamp = path, stamp

  @property
  def names(self) -> tuple[str, ...]:
    return tuple(k.name for k in self._keys)

  def lookup(self, presented: str) -> Principal | None:
    """The principal whose key is `presented`, or None. Every stored digest is compared (in
    constant time each), whichever matches."""
    digest = hashlib.sha256(presented.encode("utf-8", "surrogateescape")).digest()
    found = None
    for k in self._keys:
      if hmac.compare_digest(digest, k.digest):
        found = k
    return None if found is None else Principal(found.name, found.role, found.feedback)

  def authenticate(self, authorization: str | None) -> Principal | None:
    """The principal of an `Authorization` header value (`Bearer <key>`), or None."""
    if not authorization:
      return None
    scheme, _, key = authorization.strip().partition(" ")
    key = key.strip()
    if scheme.lower() != "bearer" or not key:
      return None
    return self.lookup(key)


def load(path) -> KeyRing:
  """Reads and checks a keys file.

  Raises:
    DataError: naming the file and, for a bad entry, its index and name.
  """
  stamp = file_stamp(path)
  data = errors.read_json(path, "API keys file")
  if not isinstance(data, dict) or not isinstance(data.get("keys"), list):
    raise errors.DataError(f'{path}: an API keys file is {{"keys": [{{"name", "sha256", "role"}}, '
                           '...]}')
  if not data["keys"]:
    raise errors.DataError(f"{path}: keys is empty (give at least one key)")
  keys, names, digests = [], set(), set()
  for i, entry in enumerate(data["keys"]):
    where = f"{path}: keys[{i}]"
    if not isinstance(entry, dict):
      raise errors.DataError(f"{where}: must be an object with name, sha256 and role")
    name = entry.get("name")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
      raise errors.DataError(f"{where}: name must be 1-64 characters of letters, digits and "
                             f"_.@- (got {name!r})")
    where = f"{where} ({name})"
    if "key" in entry:
      raise errors.DataError(f"{where}: holds a plain key; store only its SHA-256 "
                             "(python -c 'import hashlib,sys; print(hashlib.sha256("
                             "sys.argv[1].encode()).hexdigest())' KEY)")
    extra = sorted(set(entry) - {"name", "sha256", "role", "feedback"})
    if extra:
      raise errors.DataError(f"{where}: unknown field(s) {', '.join(extra)}; an entry has name, "
                             "sha256, role and optionally feedback")
    digest = entry.get("sha256")
    if not isinstance(digest, str) or not _HEX64.fullmatch(digest):
      raise errors.DataError(f"{where}: sha256 must be 64 hex digits (the SHA-256 of the key)")
    role = entry.get("role")
    if role not in ROLES:
      raise errors.DataError(f"{where}: role must be one of {', '.join(ROLES)}, got {role!r}")
    feedback = entry.get("feedback", True)
    if not isinstance(feedback, bool):
      raise errors.DataError(f"{where}: feedback must be true or false, got {feedback!r}")
    if role == ADMIN and not feedback:
      raise errors.DataError(f'{where}: an admin key may do everything; "feedback": false is for '
                             "client keys")
    if name in names:
      raise errors.DataError(f"{where}: the name {name!r} is used twice")
    if digest.lower() in digests:
      raise errors.DataError(f"{where}: the same key (sha256) is listed twice")
    names.add(name)
    digests.add(digest.lower())
    keys.append(_Key(name, bytes.fromhex(digest), role, feedback))
  return KeyRing(keys, path, stamp)


def is_loopback(host: str) -> bool:
  """Whether a bind address or host name is this machine only."""
  host = host.strip().strip("[]").lower()
  if host == "localhost":
    return True
  try:
    return ipaddress.ip_address(host).is_loopback
  except ValueError:
    return False


def check_bind(host: str, keys: KeyRing | None, allowed_hosts=()) -> None:
  """Raises ConfigError when, without a keys file, `host` is not loopback or `allowed_hosts`
  names anything but loopback (a proxy or tunnel forwarding that name would open the server to
  whoever reaches it)."""
  if keys is not None:
    return
  if not is_loopback(host):
    raise errors.ConfigError(
        f"--host={host or '(all addresses)'} without --api_keys_file would let anyone who "
        "reaches it read every prompt and answer and write the router's memory; give "
        "--api_keys_file (docs/serving.md, Keys, limits and metrics) or bind 127.0.0.1")
  public = [h for h in allowed_hosts if h.strip() and not is_loopback(h)]
  if public:
    raise errors.ConfigError(
        f"--allowed_hosts={','.join(public)} without --api_keys_file would let anyone who reaches "
        "the server by that name read every prompt and answer and write the router's memory; "
        "give --api_keys_file (docs/serving.md, Keys, limits and metrics) or drop those names")


# ---- what each role may do ----------------------------------------------------------------------
OPEN = "open"            # no key needed (/health; its details: admins only, health_details)
ANY_KEY = "any key"      # client or admin
FEEDBACK = "feedback"    # any key whose entry does not say "feedback": false
ADMIN_ONLY = "admin"

ACCESS = {
    "/health": OPEN,
    "/v1/models": ANY_KEY,
    "/v1/chat/completions": ANY_KEY,
    "/v1/feedback": FEEDBACK,          # clients: their own completions (may_feedback)
    "/v1/routes": ADMIN_ONLY,
    "/v1/memory": ADMIN_ONLY,
    "/v1/router/versions": ADMIN_ONLY,
    "/v1/router/rollback": ADMIN_ONLY,
    "/v1/router/resume": ADMIN_ONLY,
    "/metrics": ADMIN_ONLY,
}


def access(path: str) -> str:
  """Who may call `path` (ACCESS; a path not served is ANY_KEY, so it is 401 before 404)."""
  return ACCESS.get(path, ANY_KEY)


def may_feedback(who: Principal, record: dict) -> bool:
  """Whether `who` may send feedback on the completion `record` (its route record)."""
  return who.is_admin or (who.feedback and record.get("key") == who.name)


def health_details(who: Principal | None) -> bool:
  """Whether `who` (None: no valid key) reads /health's details (counters, memory, learner,
  traffic): admins only, which includes everyone on a loopback server without keys (the anonymous
  admin, who may read /v1/routes and /v1/memory anyway)."""
  return who is not None and who.is_admin


# ---- the Host header ----------------------------------------------------------------------------
def host_name(header: str | None) -> str | None:
  """The host of a Host header, without its port, lower case ("[::1]:8080" -> "::1")."""
  if not header:
    return None
  h = header.strip().lower()
  if h.startswith("["):
    end = h.find("]")
    return h[1:end] if end > 0 else None
  name, _, _ = h.partition(":")
  return name or None


class HostCheck:
  """The Host headers a server answers: its bound host, loopback names and `--allowed_hosts`.

  A page on another site that resolves its own name to this server's address (DNS rebinding)
  sends its own name as Host and is refused. `*` in allowed allows any Host (behind a proxy
  that checks it).
  """

  def __init__(self, bound_host: str, allowed=()):
    self.bound, self.allowed = bound_host, tuple(allowed)
    names = {n.strip().strip("[]").lower() for n in (bound_host, *LOOPBACK_NAMES, *allowed)}
    self.any = "*" in names
    # An unspecified bind address is not a name clients use.
    self.names = frozenset(n for n in names if n and n not in ("0.0.0.0", "::", "*"))

  def ok(self, header: str | None) -> bool:
    if self.any:
      return True
    name = host_name(header)
    return name is not None and name in self.names
