"""The endpoints file: which OpenAI-compatible servers serve each catalog LLM.

Format (JSON): an object mapping a catalog name to a non-empty list of replicas, each with the
server's base URL (OpenAI convention, usually ending in /v1) and the model name that server exposes:

  {"qwen2.5-7b-instruct": [{"base_url": "http://127.0.0.1:8000/v1", "model": "qwen"},
                           {"base_url": "http://127.0.0.1:8001/v1", "model": "qwen"}],
   "gemma-2-9b-it":       [{"base_url": "http://127.0.0.1:8002/v1", "model": "gemma"}]}

Keys starting with '_' are comments. experiments/serve_backbones.py writes this file; the
OpenAI-compatible pool reads it.
"""
from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import urllib.error
import urllib.parse
import urllib.request
from typing import Iterable, Mapping, Sequence

from gp_jax import errors
from gp_jax import files
from gp_jax.llm import catalog as catalog_lib


@dataclasses.dataclass(frozen=True)
class Endpoint:
  """One replica: a server base URL and the model name it serves."""
  base_url: str
  model: str

  @property
  def chat_url(self) -> str:
    return self.base_url + "/chat/completions"


EndpointMap = Mapping[str, Sequence[Endpoint]]


def _check_url(url: str, where: str) -> str:
  parsed = urllib.parse.urlparse(url)
  if parsed.scheme not in ("http", "https") or not parsed.netloc:
    raise errors.DataError(f"{where}: base_url must be an http(s) URL, got {url!r}")
  return url.rstrip("/")


def parse_endpoints(raw: object, *, source: str = "endpoints",
                    catalog: catalog_lib.Catalog | None = None) -> dict[str, tuple[Endpoint, ...]]:
  """Validates a decoded endpoints object.

  Args:
    raw: the decoded JSON (catalog name -> list of {base_url, model}), or Endpoint lists.
    source: what to name in error messages (a file path).
    catalog: when given, every key must be one of its LLM names.

  Returns:
    catalog name -> tuple of Endpoints, in file order.

  Raises:
    DataError: malformed structure. ConfigError: a key that is not a catalog name.
  """
  if not isinstance(raw, Mapping):
    raise errors.DataError(f"{source}: expected an object mapping LLM names to lists of endpoints")
  out: dict[str, tuple[Endpoint, ...]] = {}
  for name, rows in raw.items():
    if not isinstance(name, str) or name.startswith("_"):
      continue
    if catalog is not None and name not in catalog.names:
      raise errors.ConfigError(
          f"{source}: {errors.unknown_name('LLM', name, catalog.names)}")
    if not isinstance(rows, (list, tuple)) or not rows:
      raise errors.DataError(f"{source}: {name!r} must map to a non-empty list of endpoints")
    eps = []
    for i, row in enumerate(rows):
      where = f"{source}: {name}[{i}]"
      if isinstance(row, Endpoint):
        row = dataclasses.asdict(row)
      if not isinstance(row, Mapping):
        raise errors.DataError(f"{where}: expected an object with base_url and model")
      missing = {"base_url", "model"} - set(row)
      if missing:
        raise errors.DataError(f"{where}: missing field(s) {sorted(missing)}")
      unknown = set(row) - {"base_url", "model"}
      if unknown:
        raise errors.DataError(f"{where}: unknown field(s) {sorted(unknown)}")
      if not isinstance(row["model"], str) or not row["model"]:
        raise errors.DataError(f"{where}: model must be a non-empty string")
      if not isinstance(row["base_url"], str):
        raise errors.DataError(f"{where}: base_url must be a string")
      eps.append(Endpoint(_check_url(row["base_url"], where), row["model"]))
    out[name] = tuple(eps)
  if not out:
    raise errors.DataError(f"{source}: no endpoints listed")
  return out


def load_endpoints(path: str | os.PathLike,
                   catalog: catalog_lib.Catalog | None = None) -> dict[str, tuple[Endpoint, ...]]:
  """Reads and validates an endpoints file (see the module docstring)."""
  path = pathlib.Path(path)
  try:
    raw = json.loads(path.read_text())
  except FileNotFoundError:
    raise errors.DataError(f"{path}: endpoints file not found (experiments/serve_backbones.py "
                           "writes it)") from None
  except json.JSONDecodeError as e:
    raise errors.DataError(f"{path}: line {e.lineno}: not valid JSON ({e.msg})") from None
  return parse_endpoints(raw, source=str(path), catalog=catalog)


def dump_endpoints(endpoints: EndpointMap) -> dict:
  return {name: [dataclasses.asdict(e) for e in eps] for name, eps in endpoints.items()}


def write_endpoints(path: str | os.PathLike, endpoints: EndpointMap) -> pathlib.Path:
  """Writes the file atomically (a reader never sees half a file)."""
  path = pathlib.Path(path)
  parse_endpoints(dump_endpoints(endpoints), source=str(path))
  return files.write_atomic(path, json.dumps(dump_endpoints(endpoints), indent=2) + "\n",
                            "the endpoints file", parents=True)


def served_models(base_url: str, timeout_s: float = 5.0) -> list[str]:
  """GET {base_url}/models; the model ids the server lists. Raises BackendError if unreachable."""
  url = base_url.rstrip("/") + "/models"
  try:
    with urllib.request.urlopen(url, timeout=timeout_s) as resp:
      body = json.loads(resp.read().decode())
  except urllib.error.HTTPError as e:
    raise errors.BackendError(f"{url}: HTTP {e.code} {e.reason}") from None
  except (urllib.error.URLError, OSError, TimeoutError) as e:
    reason = getattr(e, "reason", e)
    raise errors.BackendError(f"{url}: unreachable ({reason})") from None
  except (json.JSONDecodeError, UnicodeDecodeError):
    raise errors.BackendError(f"{url}: answered with a body that is not JSON") from None
  data = body.get("data") if isinstance(body, dict) else None
  if not isinstance(data, list):
    raise errors.BackendError(f"{url}: answer has no 'data' list of models")
  return [m.get("id") for m in data if isinstance(m, dict)]


def check_reachable(endpoints: EndpointMap, timeout_s: float = 5.0,
                    names: Iterable[str] | None = None) -> None:
  """Checks at start-up that every replica answers and serves its model.

  Raises:
    BackendError: naming the LLM, the URL and what went wrong.
  """
  cache: dict[str, list[str] | errors.BackendError] = {}
  for name, eps in endpoints.items():
    if names is not None and name not in set(names):
      continue
    for ep in eps:
      if ep.base_url not in cache:
        try:
          cache[ep.base_url] = served_models(ep.base_url, timeout_s)
        except errors.BackendError as e:
          cache[ep.base_url] = e
      got = cache[ep.base_url]
      if isinstance(got, errors.BackendError):
        raise errors.BackendError(f"endpoint for LLM {name!r} at {ep.base_url}: {got}")
      if ep.model not in got:
        raise errors.BackendError(f"endpoint for LLM {name!r} at {ep.base_url} does not serve "
                                  f"model {ep.model!r}; it serves {got}")
