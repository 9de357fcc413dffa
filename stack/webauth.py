"""Basic auth for Prometheus and Alertmanager: their own ``--web.config.file`` (exporter-toolkit's web config) with a
bcrypt hash of one generated password, and that password in a file of its own for the clients that must present it
(Prometheus' scrapes of itself and of Alertmanager and its alert deliveries, through ``password_file``; Grafana's data
source; the OTel Collector's remote write).

``ragheat stack web-auth FOLDER`` writes both files; compose's one-shot ``web-auth`` service runs it into the
``rendered`` volume before Prometheus and Alertmanager start. An existing password is kept (clients and browsers
already hold it) and its web config rewritten only when it no longer matches; ``renew`` makes a new one.
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from pathlib import Path

import yaml

from rag.errors import ConfigurationError

USER = "ragheat"
"""The one user of the web config; the clients' configs name it too (deploy/prometheus/prometheus.yml, the collector's
basicauth extension, Grafana's data source)."""
WEB_CONFIG_FILE = "web.yml"
PASSWORD_FILE = "password"
PASSWORD_BYTES = 24
"""A generated password: 24 random bytes, URL-safe base64 (32 characters), so it also fits in a URL's user part (the
compose healthchecks' ``wget http://ragheat:PASSWORD@...``)."""
BCRYPT_ROUNDS = 12
"""bcrypt's cost: a guess costs about a quarter second of CPU. Prometheus and Alertmanager cache a verified password,
so the cost is paid once per client, not per request."""


@dataclass(frozen=True)
class WebAuth:
    """The files of one web config: ``web_config`` (the bcrypt hash, for ``--web.config.file``) and ``password_file``
    (the plain password, for the clients); ``created`` says whether the password is new."""

    web_config: Path
    password_file: Path
    created: bool

    @property
    def password(self) -> str:
        return read_password(self.password_file)


def read_password(path: Path) -> str:
    """The password a ``password`` file holds; ``ConfigurationError`` naming the file when it is unreadable or empty."""
    try:
        password = Path(path).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigurationError(f"{path} cannot be read ({exc}); `ragheat stack web-auth --renew` writes a new "
                                 f"password") from None
    if not password:
        raise ConfigurationError(f"{path} is empty; `ragheat stack web-auth --renew` writes a new password")
    return password


def web_config(password: str) -> dict:
    """The web config that asks every request for ``USER`` and ``password`` (checked against its bcrypt hash)."""
    import bcrypt

    hashed = bcrypt.hashpw(password.encode("utf-8"), bcrypt.gensalt(rounds=BCRYPT_ROUNDS)).decode("ascii")
    return {"basic_auth_users": {USER: hashed}}


def _matches(config_path: Path, password: str) -> bool:
    """Whether the web config at ``config_path`` accepts ``USER`` with ``password`` (False when it is missing or not
    a web config)."""
    import bcrypt

    try:
        hashed = (yaml.safe_load(config_path.read_text(encoding="utf-8")) or {})["basic_auth_users"][USER]
        return bcrypt.checkpw(password.encode("utf-8"), hashed.encode("ascii"))
    except (OSError, KeyError, TypeError, ValueError, AttributeError, yaml.YAMLError):
        return False


def _write(path: Path, text: str, mode: int) -> None:
    """Write ``text`` to ``path`` with ``mode`` from its first byte (a new file never exists with a wider mode),
    replacing it in one rename so a reader never sees half a file."""
    partial = path.with_name(path.name + ".partial")
    partial.unlink(missing_ok=True)
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.chmod(partial, mode)  # the umask may have narrowed it: the mode asked for is the mode written
    os.replace(partial, path)


def ensure_web_auth(folder: Path, *, renew: bool = False, world_readable: bool = False) -> WebAuth:
    """The web config and password file in ``folder``, created when missing (or ``renew``). The password file is mode
    600 (the user who runs Prometheus reads it), or 644 with ``world_readable``: inside compose's volume, where the
    services' own users (Prometheus' and Alertmanager's nobody, Grafana's, the collector's) read it and no one else
    can reach it. The web config holds only the hash (mode 644)."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise ConfigurationError(f"{folder} exists and is not a folder; give web-auth a folder to write into")
    folder.mkdir(parents=True, exist_ok=True)
    password_path, config_path = folder / PASSWORD_FILE, folder / WEB_CONFIG_FILE
    mode = 0o644 if world_readable else 0o600
    created = renew or not password_path.exists()
    if created:
        password = secrets.token_urlsafe(PASSWORD_BYTES)
        # No newline: Grafana's $__file{} and the collector's ${file:} read the file as it is.
        _write(password_path, password, mode)
    else:
        password = read_password(password_path)
        os.chmod(password_path, mode)
    if created or not _matches(config_path, password):
        _write(config_path, "# Generated by `ragheat stack web-auth`: Prometheus' and Alertmanager's "
                            "--web.config.file.\n" + yaml.safe_dump(web_config(password)), 0o644)
    return WebAuth(config_path, password_path, created)
