"""Test releases: module artifacts (good and hostile tar.gz files) and a local HTTPS server
that serves them with a throw-away certificate. No network leaves the machine."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import ssl
import tarfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


def tar_gz(entries: list[tarfile.TarInfo | tuple[tarfile.TarInfo, bytes]]) -> bytes:
    """A tar.gz of ``entries`` (a TarInfo alone, or with the file's bytes)."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for entry in entries:
            info, data = entry if isinstance(entry, tuple) else (entry, None)
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return gzip.compress(raw.getvalue(), mtime=0)


def file_entry(name: str, data: bytes, mode: int = 0o644) -> tuple[tarfile.TarInfo, bytes]:
    """A regular file entry."""
    info = tarfile.TarInfo(name)
    info.mode = mode
    return info, data


def special_entry(name: str, kind: bytes, linkname: str = "") -> tarfile.TarInfo:
    """A link, device, FIFO or directory entry."""
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, linkname
    info.mode = 0o755 if kind == tarfile.DIRTYPE else 0o644
    return info


def module_json(module_id: str, version: str) -> tuple[tarfile.TarInfo, bytes]:
    """The ``module.json`` entry naming ``module_id`` at ``version``."""
    return file_entry("module.json", json.dumps({"id": module_id, "version": version}).encode())


def module_tar(module_id: str, version: str, files: dict[str, bytes] | None = None) -> bytes:
    """A well-formed module artifact."""
    files = files if files is not None else {"index.js": f"// {module_id} {version}\n".encode()}
    return tar_gz([module_json(module_id, version), special_entry("lib", tarfile.DIRTYPE),
                   *(file_entry(name, data) for name, data in files.items())])


class _QuietServer(ThreadingHTTPServer):
    """Says nothing when a client hangs up mid-answer (the installer does, on purpose, at a cap)."""

    def handle_error(self, request: object, client_address: object) -> None:
        pass


@dataclass
class Route:
    """What one path answers: a status, headers and a body (or a body file)."""

    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    body_file: Path | None = None
    announce_length: bool = True
    """Send Content-Length; without it the body simply runs until the connection closes."""
    delay_s: float = 0.0
    """Wait this long before answering (a slow or hung host)."""
    fail_first: int = 0
    """Answer this many requests with 503 and an error body before answering as above."""
    cut_first: int = 0
    """Announce the whole body but hang up after ``cut_at`` bytes of it, this many requests."""
    cut_at: int = 0
    trickle_s: float = 0.0
    """Send the body a byte at a time, pausing this long between bytes (until the client hangs up)."""


class ReleaseServer:
    """An HTTPS server on 127.0.0.1 answering registered paths and counting every request."""

    def __init__(self, cert_chain: Path, key: Path) -> None:
        self.routes: dict[str, Route] = {}
        self.hits: Counter[str] = Counter()
        self.sent: dict[str, list[int]] = {}
        """Body bytes each request to a path was sent before the answer ended or the client hung up."""
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                server.hits[self.path] += 1
                route = server.routes.get(self.path, Route(404, b"no such release"))
                time.sleep(route.delay_s)
                if route.fail_first > 0:
                    route.fail_first -= 1
                    route = Route(503, b"release store is warming up")
                self.send_response(route.status)
                size = route.body_file.stat().st_size if route.body_file else len(route.body)
                headers = {"Content-Length": str(size)} if route.announce_length else {}
                headers.update(route.headers)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.end_headers()
                sent = server.sent.setdefault(self.path, [])
                sent.append(0)
                if route.body_file:
                    with open(route.body_file, "rb") as body:
                        while chunk := body.read(1 << 20):
                            self.wfile.write(chunk)
                            sent[-1] += len(chunk)
                elif route.cut_first > 0:
                    route.cut_first -= 1
                    self.wfile.write(route.body[:route.cut_at])
                    sent[-1] += route.cut_at
                    self.close_connection = True
                elif route.trickle_s:
                    for i in range(len(route.body)):
                        self.wfile.write(route.body[i:i + 1])
                        self.wfile.flush()
                        sent[-1] += 1
                        time.sleep(route.trickle_s)
                else:
                    self.wfile.write(route.body)
                    sent[-1] += len(route.body)

            def log_message(self, *args: object) -> None:
                pass

        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(cert_chain, key)
        self.httpd = _QuietServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.httpd.socket = context.wrap_socket(self.httpd.socket, server_side=True)
        self.port = self.httpd.server_address[1]
        self.host = f"127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)
        self._thread.start()

    def url(self, path: str) -> str:
        return f"https://{self.host}{path}"

    def serve(self, path: str, body: bytes = b"", status: int = 200, **headers: str) -> str:
        """Answer ``path`` with ``body``; returns its URL."""
        self.routes[path] = Route(status, body, {k.replace("_", "-"): v for k, v in headers.items()})
        return self.url(path)

    def release(self, prefix: str, module_id: str, version: str, artifact: bytes | None = None,
                core_api: str = "^1.10.0", sha256: str | None = None, **extra: object) -> str:
        """Serve an artifact and its manifest under ``prefix``; returns the manifest URL."""
        artifact = module_tar(module_id, version) if artifact is None else artifact
        artifact_url = self.serve(f"{prefix}/{module_id}-{version}.tar.gz", artifact)
        manifest = {"id": module_id, "version": version, "coreApi": core_api, "artifactUrl": artifact_url,
                    "sha256": sha256 or hashlib.sha256(artifact).hexdigest(), **extra}
        return self.serve(f"{prefix}/{module_id}-{version}.json", json.dumps(manifest).encode())

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join(timeout=5)
