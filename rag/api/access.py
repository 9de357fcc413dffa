"""Who may call the API, and how often: API keys and a token-bucket rate limit per key.

Keys arrive as ``Authorization: Bearer KEY`` or ``X-API-Key: KEY``. Only their SHA-256 digests are kept (from
``server.api_keys``, hashed at start-up, and ``server.api_keys_file``, stored hashed), and a presented key's digest is
compared with every stored one in constant time. A fast hash is enough here: keys are random tokens of at least 16
characters (``ragheat keys new`` makes 256-bit ones), and a slow password hash (bcrypt, scrypt), which protects
low-entropy secrets from offline guessing, would cost every request milliseconds. Keys are never logged, put in spans
or echoed in errors; a key is known by its name from the file, else ``key-`` and the first 8 hex digits of its digest.

``AccessPolicy.check`` runs before a request's body is read: authentication, then each ``RequestGate`` (the rate limit
is one). Admission control is not a gate: it needs the body's deadline and holds a slot until the query is done
(``rag.api.admission``; its refusals are counted apart, ``ragheat_requests_shed_total``). Every refusal is counted by reason (``Rejections``), from the closed
set ``REJECTION_REASONS``, which telemetry exports as ``ragheat_requests_rejected_total{reason}``.

Standard library only: telemetry imports ``REJECTION_REASONS`` from here.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import math
import secrets
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Mapping, Protocol, Sequence

from rag.errors import ConfigurationError
from rag.stages import PRIORITIES
from rag.tally import Tally

REJECTION_REASONS = ("unauthenticated", "forbidden", "rate_limited", "body_too_large", "headers_too_large",
                     "request_timeout")
"""Why a request was turned away before a route ran, each also the error kind of its response: no or a wrong key
(401), an admin call on a service without keys (403), over the key's rate (429), a body over server.max_body_bytes
(413), a request head over server.max_header_bytes (431), a head or body that did not arrive in time (408). Queries
shed under load are counted apart (``rag.api.admission.SHED_REASONS``)."""

OPEN_PATHS = frozenset({"/healthz", "/readyz", "/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json"})
"""Served without a key: the probes an orchestrator needs, and the API's description (it holds no data)."""
LIMITED_PREFIXES = ("/v1/", "/admin/")
"""Paths the rate limit counts (the probes, /metrics and the docs are not)."""
ADMIN_PREFIX = "/admin/"
KEY_PREFIX = "rh_"
MIN_API_KEY_CHARS = 16
"""Keys are random tokens (``ragheat keys new``: 32 bytes); a shorter one is a password, which a fast hash does not
protect."""
HASH_SCHEME = "sha256"


@dataclass(frozen=True)
class Refusal:
    """A request turned away: ``reason`` (one of ``REJECTION_REASONS``, also its error kind), a sentence for the
    client, and response headers (``Retry-After``, ``WWW-Authenticate``)."""

    reason: str
    sentence: str
    headers: tuple[tuple[str, str], ...] = ()


class RequestGate(Protocol):
    """One admission decision, taken before the body is read: None admits the request, a ``Refusal`` turns it away.
    ``client`` names who asks: the key's name, or ``address HOST`` on a service without keys."""

    def admit(self, client: str, path: str) -> Refusal | None: ...


# -- keys ------------------------------------------------------------------------------------------------------

def new_key() -> str:
    """A fresh API key: 32 random bytes, URL-safe."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


def key_digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8")).digest()


PRIORITY_FIELD = "priority="
KEY_PRIORITY = "key_priority"
"""Where ``AccessMiddleware`` leaves the identified key's priority in the ASGI scope's ``state``."""


def key_line(key: str, name: str = "", priority: str = "normal") -> str:
    """The line of ``server.api_keys_file`` that accepts ``key``: ``sha256:<hex> [name] [priority=P]``."""
    if name and (not name.isprintable() or any(c.isspace() for c in name) or name.startswith(PRIORITY_FIELD)):
        raise ValueError(f"a key's name is one word without spaces, got {name!r}")
    if priority not in PRIORITIES:
        raise ValueError(f"a key's priority is one of {', '.join(PRIORITIES)}, got {priority!r}")
    return (f"{HASH_SCHEME}:{key_digest(key).hex()}" + (f" {name}" if name else "")
            + (f" {PRIORITY_FIELD}{priority}" if priority != "normal" else ""))


@dataclass(frozen=True)
class StoredKey:
    digest: bytes
    name: str
    priority: str = "normal"  # its requests' priority (rag.api.admission): X-Request-Priority may only lower it


def read_keys_file(path: Path) -> list[StoredKey]:
    """The keys of a keys file: one ``sha256:<64 hex digits> [name] [priority=high|normal|low]`` a line, ``#``
    comments and blank lines allowed. ``ConfigurationError`` naming the file and line (never its content) when it is
    unreadable or wrong."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigurationError(f"server.api_keys_file {path} cannot be read: {exc}") from exc
    keys = []
    for number, line in enumerate(lines, 1):
        fields = line.split("#", 1)[0].split()
        if not fields:
            continue
        scheme, _, digest = fields[0].partition(":")
        try:
            raw = bytes.fromhex(digest)
        except ValueError:
            raw = b""
        priorities = [f.removeprefix(PRIORITY_FIELD) for f in fields[1:] if f.startswith(PRIORITY_FIELD)]
        names = [f for f in fields[1:] if not f.startswith(PRIORITY_FIELD)]
        if (scheme != HASH_SCHEME or len(raw) != 32 or len(names) > 1 or len(priorities) > 1
                or any(p not in PRIORITIES for p in priorities)):
            raise ConfigurationError(f"server.api_keys_file {path}, line {number}: expected 'sha256:<64 hex digits> "
                                     f"[name] [priority={'|'.join(PRIORITIES)}]' (`ragheat keys new` prints one)")
        keys.append(StoredKey(raw, names[0] if names else f"key-{raw.hex()[:8]}",
                              priorities[0] if priorities else "normal"))
    return keys


class KeyRing:
    """The accepted keys, as digests. ``identify`` names the key presented, or says None; ``reload`` re-reads the
    keys file (a bad file keeps the keys already loaded and raises)."""

    def __init__(self, keys: Iterable[str] = (), keys_file: Path | None = None) -> None:
        keys = list(keys)
        for n, key in enumerate(keys, 1):
            if len(key) < MIN_API_KEY_CHARS or not key.isascii() or not key.isprintable() or " " in key:
                # Never echo the key: say which one and why.
                raise ConfigurationError(f"server.api_keys: key {n} must be at least {MIN_API_KEY_CHARS} printable "
                                         f"ASCII characters without spaces (`ragheat keys new` makes one)")
        self._inline = [StoredKey(key_digest(k), f"key-{key_digest(k).hex()[:8]}") for k in keys]
        self.keys_file = keys_file
        self._keys = self._inline + (read_keys_file(keys_file) if keys_file is not None else [])

    @classmethod
    def from_settings(cls, server) -> "KeyRing":
        return cls([k.get_secret_value() for k in server.api_keys], server.api_keys_file)

    @property
    def enabled(self) -> bool:
        """True when keys are configured (an empty keys file still means: keys required, none accepted)."""
        return bool(self._keys) or self.keys_file is not None

    def __len__(self) -> int:
        return len(self._keys)

    def reload(self) -> None:
        if self.keys_file is not None:
            self._keys = self._inline + read_keys_file(self.keys_file)

    def identify(self, presented: str) -> str | None:
        """The name of the key ``presented`` is, or None."""
        found = self.find(presented)
        return None if found is None else found.name

    def find(self, presented: str) -> StoredKey | None:
        """The stored key ``presented`` is, or None. Every stored digest is compared, each in constant time, so the
        time taken says nothing about which key (or how much of one) matched."""
        digest = key_digest(presented)
        found = None
        for stored in self._keys:
            if hmac.compare_digest(digest, stored.digest) and found is None:
                found = stored
        return found


def presented_key(headers: Mapping[bytes, bytes]) -> str | None:
    """The key a request carries: ``Authorization: Bearer KEY``, else ``X-API-Key: KEY``; None without one."""
    authorization = headers.get(b"authorization")
    if authorization:
        scheme, _, token = authorization.decode("latin-1").strip().partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            return token.strip()
    key = headers.get(b"x-api-key")
    if key and key.strip():
        return key.decode("latin-1").strip()
    return None


# -- exposure --------------------------------------------------------------------------------------------------

LOOPBACK_NAMES = frozenset({"localhost"})
"""Host names that always mean this machine; any other name may resolve to an address others reach."""


def is_loopback(host: str) -> bool:
    """True when a server bound to ``host`` answers only this machine: 127.0.0.0/8, ::1 or ``localhost``. Any other
    name counts as reachable (what it resolves to can change), and so does the empty host (every interface)."""
    host = host.strip().strip("[]").lower()
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


INSECURE_FLAG = "--insecure-no-api-key"


def open_to_the_network(server) -> bool:
    """Whether these server settings answer anyone on the network without a key: a host beyond loopback and no key
    configured (whatever ``server.insecure_no_api_key`` says)."""
    return not (is_loopback(server.host) or server.api_keys or server.api_keys_file is not None)


def open_api_problem(server) -> str | None:
    """Why these server settings would serve an API anyone on the network may call (a sentence naming both ways
    out), or None: the host is loopback, keys are configured, or ``server.insecure_no_api_key`` says the operator
    chose an open API."""
    if not open_to_the_network(server) or server.insecure_no_api_key:
        return None
    return (f"server.host {server.host!r} is reachable from the network and no API key is configured: make one "
            f"with `ragheat keys new --file api-keys.txt` and pass --api-keys-file api-keys.txt (or set "
            f"RAGHEAT_SERVER__API_KEYS_FILE / RAGHEAT_SERVER__API_KEYS), or serve an open API on purpose with "
            f"{INSECURE_FLAG} (RAGHEAT_SERVER__INSECURE_NO_API_KEY=true); --host 127.0.0.1 needs neither")


OPEN_API_WARNING = (f"{INSECURE_FLAG}: this API answers anyone who reaches %s without a key, on every route but "
                    f"/admin; put it behind your own authentication or firewall")


# -- rate limit ------------------------------------------------------------------------------------------------

class TokenBucketLimit:
    """A token bucket per client: ``burst`` requests at once, then ``rate_per_s`` a second. A refusal says when the
    next token comes (``Retry-After``, whole seconds, at least 1). At most ``max_clients`` buckets are kept, the least
    recently used dropped first (a dropped bucket comes back full), so memory stays bounded whoever asks."""

    def __init__(self, rate_per_s: float, burst: int, *, clock: Callable[[], float] = time.monotonic,
                 max_clients: int = 100_000) -> None:
        if rate_per_s <= 0 or burst < 1:
            raise ValueError(f"a rate limit needs rate_per_s > 0 and burst >= 1, got {rate_per_s} and {burst}")
        self.rate, self.burst, self.clock, self.max_clients = rate_per_s, burst, clock, max_clients
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # client -> (tokens, when)
        self._lock = threading.Lock()

    def admit(self, client: str, path: str) -> Refusal | None:
        if not path.startswith(LIMITED_PREFIXES):
            return None
        with self._lock:
            now = self.clock()
            tokens, then = self._buckets.pop(client, (float(self.burst), now))
            tokens = min(float(self.burst), tokens + (now - then) * self.rate)
            admitted = tokens >= 1.0
            self._buckets[client] = (tokens - 1.0 if admitted else tokens, now)
            if len(self._buckets) > self.max_clients:
                self._buckets.popitem(last=False)
        if admitted:
            return None
        wait_s = (1.0 - tokens) / self.rate
        return Refusal("rate_limited", f"over the rate limit of {self.rate:g} requests/s ({self.burst} at once) for "
                                       f"this key (server.rate_limit_per_s); the next request is admitted in "
                                       f"{wait_s:.2f} s", (("Retry-After", str(max(1, math.ceil(wait_s)))),))


# -- policy ----------------------------------------------------------------------------------------------------

class Rejections(Tally):
    """Refusals counted by reason (``REJECTION_REASONS``); ``listeners`` (telemetry) hear each as it happens."""

    def __init__(self) -> None:
        super().__init__(REJECTION_REASONS, "rejection reason (add it to REJECTION_REASONS)")


UNAUTHENTICATED_HEADERS = (("WWW-Authenticate", 'Bearer realm="ragheat"'),)


class AccessPolicy:
    """Authentication, then each gate, for a request's path and headers (before its body is read)."""

    def __init__(self, keys: KeyRing, gates: Sequence[RequestGate] = ()) -> None:
        self.keys, self.gates = keys, list(gates)
        self.rejections = Rejections()

    @classmethod
    def from_settings(cls, server) -> "AccessPolicy":
        gates = [TokenBucketLimit(server.rate_limit_per_s, server.rate_limit_burst)] if server.rate_limit_per_s else []
        return cls(KeyRing.from_settings(server), gates)

    def check(self, path: str, headers: Mapping[bytes, bytes], client_host: str | None,
              state: dict | None = None) -> Refusal | None:
        """None admits the request (and leaves its key's priority in ``state[KEY_PRIORITY]``), else why not."""
        if path in OPEN_PATHS:
            return None
        if self.keys.enabled:
            presented = presented_key(headers)
            if presented is None:
                return Refusal("unauthenticated", "this API needs a key: send 'Authorization: Bearer KEY' or "
                                                  "'X-API-Key: KEY'", UNAUTHENTICATED_HEADERS)
            stored = self.keys.find(presented)
            if stored is None:
                return Refusal("unauthenticated", "the API key is not valid", UNAUTHENTICATED_HEADERS)
            client = stored.name
            if state is not None:
                state[KEY_PRIORITY] = stored.priority
        else:  # an open API; admin calls are refused by their route (403), after routing has answered a wrong method
            client = f"address {client_host or 'unknown'}"
        for gate in self.gates:
            refusal = gate.admit(client, path)
            if refusal is not None:
                return refusal
        return None

    def admin_refusal(self) -> Refusal | None:
        """Admin calls need keys: on a service without them they are refused (``forbidden``, counted). The route
        asks, rather than ``check``, so that a wrong method on an admin path is still answered 405 with ``Allow``."""
        if self.keys.enabled:
            return None
        self.rejections.count("forbidden")
        return Refusal("forbidden", "admin calls need API keys: set server.api_keys or server.api_keys_file")
