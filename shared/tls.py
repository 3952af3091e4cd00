"""TLS contexts from PEM files, for the links that cross hosts (docs/security.md, "TLS"): the
gateway's shard listener (a server context that may require client certificates, rebuilt when
its files change) and every service's NATS connection (a client context trusting a CA).

The standard library's :mod:`ssl` does the work; nothing here parses a certificate."""

from __future__ import annotations

import logging
import os
import ssl
import time
from collections.abc import Sequence

from shared.errors import ShardbusError

log = logging.getLogger("shardbus.tls")

MINIMUM_VERSION = ssl.TLSVersion.TLSv1_2
"""The oldest TLS either side accepts (docs/security.md, "TLS")."""


class TLSConfigError(ShardbusError, ValueError):
    """A certificate, key or CA file that cannot be used; the message names the file and why."""


def _load_chain(context: ssl.SSLContext, cert: str, key: str) -> None:
    try:
        context.load_cert_chain(cert, key or None)
    except FileNotFoundError as exc:
        raise TLSConfigError(f"certificate or key file not found: {exc.filename or cert}") from None
    except (ssl.SSLError, OSError) as exc:
        raise TLSConfigError(f"cannot load the certificate {cert} with the key {key or cert}: "
                             f"{getattr(exc, 'reason', None) or exc}") from None


def _load_ca(context: ssl.SSLContext, ca: str) -> None:
    try:
        context.load_verify_locations(cafile=ca)
    except FileNotFoundError:
        raise TLSConfigError(f"CA file not found: {ca}") from None
    except (ssl.SSLError, OSError) as exc:
        raise TLSConfigError(f"cannot load the CA file {ca}: {getattr(exc, 'reason', None) or exc}") from None


def server_context(cert: str, key: str, client_ca: str = "") -> ssl.SSLContext:
    """A server context presenting ``cert`` (its chain) with ``key``; with ``client_ca`` every
    client must present a certificate signed by it (CERT_REQUIRED)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = MINIMUM_VERSION
    _load_chain(context, cert, key)
    if client_ca:
        _load_ca(context, client_ca)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def client_context(ca: str, cert: str = "", key: str = "") -> ssl.SSLContext:
    """A client context verifying the server against ``ca`` (its hostname too), presenting
    ``cert`` with ``key`` when given (for a server that requires client certificates)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # check_hostname and CERT_REQUIRED
    context.minimum_version = MINIMUM_VERSION
    _load_ca(context, ca)
    if cert:
        _load_chain(context, cert, key)
    return context


RECHECK_S = 1.0
"""How often, at most, :class:`ReloadingServerContext` looks at its files' times and sizes."""


def _signature(paths: Sequence[str]) -> tuple[tuple[int, int, int], ...]:
    """What changes when a file is replaced or rewritten: its inode, time and size."""
    found = []
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            found.append((0, 0, 0))
            continue
        found.append((st.st_ino, st.st_mtime_ns, st.st_size))
    return tuple(found)


class ReloadingServerContext:
    """A server context rebuilt from its files when they change (checked at most every
    :data:`RECHECK_S`, when :attr:`context` is read: at each new connection) or when
    :meth:`reload` is called (SIGHUP). A renewed certificate is served to the next connection;
    the ones already open keep theirs. Files that cannot be loaded (a key not matching its
    certificate while the two are replaced one after the other) leave the previous context in
    use, logged once for those files, and are tried again when they change."""

    def __init__(self, cert: str, key: str, client_ca: str = "", *, what: str = "TLS") -> None:
        self.cert, self.key, self.client_ca, self.what = cert, key, client_ca, what
        self.paths = [p for p in (cert, key, client_ca) if p]
        self._signature = _signature(self.paths)
        self._context = server_context(cert, key, client_ca)  # a bad file stops the start: raised
        self._checked_at = time.monotonic()
        self._failed: tuple[tuple[int, int, int], ...] | None = None
        self.loads = 1
        """How many contexts were built (the first at start)."""

    @property
    def requires_client_certificates(self) -> bool:
        return bool(self.client_ca)

    @property
    def context(self) -> ssl.SSLContext:
        """The context for a new connection (rebuilt first if the files changed)."""
        now = time.monotonic()
        if now - self._checked_at >= RECHECK_S:
            self._checked_at = now
            signature = _signature(self.paths)
            if signature != self._signature and signature != self._failed:
                self._load(signature, "its files changed")
        return self._context

    def reload(self, why: str = "asked to reload") -> bool:
        """Rebuild the context from the files now; False (the old one kept) if they cannot be used."""
        self._checked_at = time.monotonic()
        return self._load(_signature(self.paths), why)

    def _load(self, signature: tuple[tuple[int, int, int], ...], why: str) -> bool:
        try:
            context = server_context(self.cert, self.key, self.client_ca)
        except TLSConfigError as exc:
            if self._failed != signature:
                log.error(f"{self.what} certificate not reloaded; the previous one stays in use",
                          extra={"reason": str(exc), "why": why})
            self._failed = signature
            return False
        self._context, self._signature, self._failed = context, signature, None
        self.loads += 1
        log.info(f"{self.what} certificate reloaded", extra={"cert": self.cert, "why": why})
        return True


def client_context_or_none(ca: str, cert: str = "", key: str = "") -> ssl.SSLContext | None:
    """:func:`client_context`, or None when no CA is given (a plain link, on loopback)."""
    return client_context(ca, cert, key) if ca else None
