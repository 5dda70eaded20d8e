"""A client of a Sprout worker's HTTP API (OpenLambda's): run, deploy and manage lambdas.

    >>> import sprout
    >>> worker = sprout.Client("http://127.0.0.1:5000")
    >>> worker.deploy("examples/lambdas/echo")
    >>> worker.run("echo", {"hello": "world"})
    {'hello': 'world'}

Errors from the worker raise :class:`SproutError` carrying its HTTP status, its stable error
code (``timeout``, ``handler_exception``, ...) and, for handler failures, the traceback.

Every endpoint but ``/run/...`` and ``/status`` needs the worker's API token. The client sends
the first it finds: ``token=``, ``$SPROUT_TOKEN``, or (for a loopback or ``localhost`` URL) the
one a worker on this machine leaves in ``/run/sprout/api/<host>:<port>`` while it runs. It
never sends it to ``/run``, whose handlers see the request's headers.
"""

import http.client
import io
import ipaddress
import json
import os
import socket
import tarfile
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field

_SKIP = {"__pycache__", ".git", ".pytest_cache"}
DISCOVERY_DIR = "/run/sprout/api"


class SproutError(Exception):
    """The worker refused or failed a request."""

    def __init__(self, status, code, message, body=None):
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.body = body or {}

    @property
    def request_id(self):
        """The worker's id of the failed request (its log entries carry it)."""
        return self.body.get("request_id")

    @property
    def traceback(self):
        return self.body.get("traceback")


@dataclass
class Response:
    """A raw HTTP reply, for lambdas that are WSGI applications."""

    status: int
    headers: Mapping = field(default_factory=dict)  # case-insensitive (email.message.Message)
    body: bytes = b""

    def json(self):
        return json.loads(self.body)


def pack(directory):
    """A lambda directory (holding f.py, or an ol.yaml naming its entry file) as tar.gz
    bytes, without caches; the worker checks the rest."""
    if not any(os.path.isfile(os.path.join(directory, name)) for name in ("f.py", "ol.yaml")):
        raise ValueError(f"{directory} has neither f.py nor ol.yaml")
    buffer = io.BytesIO()

    def keep(info):
        parts = info.name.split("/")
        return None if _SKIP.intersection(parts) else info

    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for entry in sorted(os.listdir(directory)):
            archive.add(os.path.join(directory, entry), arcname=entry, filter=keep)
    return buffer.getvalue()


def discovered_token(url):
    """The token a worker on this machine published for ``url``'s address, or None: only for
    a loopback or ``localhost`` URL (127.0.0.1, then ::1), skipping files that do not exist or
    cannot be read."""
    parts = urllib.parse.urlsplit(url)
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return None
    host = (parts.hostname or "").lower()
    if host == "localhost":
        names = [f"127.0.0.1:{port}", f"[::1]:{port}"]
    else:
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            return None
        if not ip.is_loopback:
            return None
        names = [f"[{ip}]:{port}" if ip.version == 6 else f"{ip}:{port}"]
    for name in names:
        try:
            with open(os.path.join(DISCOVERY_DIR, name)) as f:
                token = f.read().strip()
        except OSError:
            continue
        if token:
            return token
    return None


# A reused keep-alive connection that fails with one of these before any reply was read was
# most likely closed by the server while idle: the request is sent once more on a new one.
_STALE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError, ConnectionAbortedError)


class Client:
    # Client.map (sprout.map over this client's worker) is set by the package's __init__:
    # sprout.offload, which it runs, sits above this module and uses it.

    def __init__(self, url="http://127.0.0.1:5000", timeout=120, token=None):
        self.url = url.rstrip("/")
        self.timeout = timeout
        self._token = token
        self._idle = []  # keep-alive connections not in use (sprout.map's requests)
        self._idle_lock = threading.Lock()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        """Close the keep-alive connections this client holds (they are opened again when
        needed)."""
        with self._idle_lock:
            idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()

    def token(self):
        """The API token this client sends: ``token=``, else ``$SPROUT_TOKEN``, else the one
        discovered for its URL (looked up at each call, so a client made before its worker
        started finds it). None when there is none."""
        return self._token or os.environ.get("SPROUT_TOKEN") or discovered_token(self.url)

    def _call(self, method, path, body=None, headers=None):
        headers = dict(headers or {})
        if not path.startswith("/run/") and not any(k.lower() == "authorization" for k in headers):
            token = self.token()
            if token:
                headers["Authorization"] = f"Bearer {token.strip()}"
        request = urllib.request.Request(self.url + path, data=body, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as reply:
                return Response(reply.status, reply.headers, reply.read())
        except urllib.error.HTTPError as err:
            return Response(err.code, err.headers, err.read())

    def _connect(self):
        parts = urllib.parse.urlsplit(self.url)
        kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        connection = kind(parts.hostname, parts.port, timeout=self.timeout)
        connection.connect()
        connection.sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        return connection

    def _keep_alive_call(self, method, path, body=None, headers=None, read_timeout=None):
        """Send a request without a token over one of the client's keep-alive connections
        (each thread takes one of its own while the request lasts; they are kept for later
        calls); returns the :class:`Response`. The client's timeout bounds connecting, and
        ``read_timeout`` (None: none) the wait for each part of the reply. Connection errors
        raise (OSError, http.client.HTTPException)."""
        path = urllib.parse.urlsplit(self.url).path.rstrip("/") + path
        headers = dict(headers or {})
        with self._idle_lock:
            connection = self._idle.pop() if self._idle else None
        while True:
            reused = connection is not None
            if connection is None:
                connection = self._connect()
            try:
                connection.sock.settimeout(read_timeout)
                connection.request(method, path, body=body, headers=headers)
                reply = connection.getresponse()
                data = reply.read()
            except _STALE:
                connection.close()
                if not reused:
                    raise
                connection = None  # closed while idle: once more, on a new connection
                continue
            except BaseException:
                connection.close()
                raise
            if reply.will_close:
                connection.close()
            else:
                with self._idle_lock:
                    self._idle.append(connection)
            return Response(reply.status, reply.headers, data)

    @staticmethod
    def _check(response):
        if response.status < 400:
            return response
        try:
            body = json.loads(response.body)
            raise SproutError(response.status, body.get("error", "unknown"), body.get("message", ""), body)
        except (ValueError, AttributeError):
            raise SproutError(response.status, "unknown", response.body.decode(errors="replace")) from None

    def run(self, name, event=None):
        """Run ``f(event)`` of lambda ``name``; returns what it returned."""
        body = json.dumps(event).encode()
        response = self._check(self._call("POST", f"/run/{name}", body, {"Content-Type": "application/json"}))
        return json.loads(response.body)

    def request(self, method, name, path="/", body=b"", headers=None):
        """Send an HTTP request to a WSGI lambda; returns the raw :class:`Response`
        (errors of the worker itself still raise)."""
        response = self._call(method, f"/run/{name}{path}", body or None, headers)
        if response.status >= 400 and response.headers.get("Content-Type") == "application/json":
            try:
                if "error" in json.loads(response.body):
                    self._check(response)
            except ValueError:
                pass
        return response

    def deploy(self, directory, name=None, isolation=None):
        """Upload a lambda directory; returns the new version's metadata. ``isolation`` names
        the back-end (isolation class) to run it in, one the worker runs; by default its
        previous version's, else the worker's configuration."""
        name = name or os.path.basename(os.path.abspath(directory))
        path = self._registry_path(name, isolation)
        response = self._check(self._call("POST", path, pack(directory), {"Content-Type": "application/gzip"}))
        return json.loads(response.body)

    def upload(self, name, archive, isolation=None):
        """Upload raw bytes as lambda ``name`` (a tar.gz)."""
        return json.loads(self._check(self._call("POST", self._registry_path(name, isolation), archive)).body)

    @staticmethod
    def _registry_path(name, isolation):
        return f"/registry/{name}" + (f"?isolation={isolation}" if isolation else "")

    def delete(self, name):
        return json.loads(self._check(self._call("DELETE", f"/registry/{name}")).body)

    def list(self):
        return json.loads(self._check(self._call("GET", "/registry")).body)

    def get(self, name):
        return json.loads(self._check(self._call("GET", f"/registry/{name}")).body)

    def sites(self):
        """The app port's sites: {host: {"site": {"lambda": ..., "static": {...}}, "source": ...}}."""
        return json.loads(self._check(self._call("GET", "/sites")).body)

    def put_site(self, host, lambda_name, static=None):
        """Serve ``lambda_name`` on the app port for requests to ``host`` (with ``static``:
        {"/prefix/": "/host/dir"})."""
        body = json.dumps({"lambda": lambda_name, "static": static or {}}).encode()
        path = f"/sites/{urllib.parse.quote(host, safe='')}"
        return json.loads(self._check(self._call("PUT", path, body, {"Content-Type": "application/json"})).body)

    def delete_site(self, host):
        return json.loads(self._check(self._call("DELETE", f"/sites/{urllib.parse.quote(host, safe='')}")).body)

    def status(self):
        return self._check(self._call("GET", "/status")).body.decode()

    def stats(self):
        return json.loads(self._check(self._call("GET", "/stats")).body)

    def metrics(self):
        return self._check(self._call("GET", "/metrics")).body.decode()

    def packages(self):
        """The install cache's packages: [{"key": "name==version", "top_level": [...], ...}]."""
        return self._check(self._call("GET", "/packages")).json()

    def logs(self, name, since=None, limit=None, request=None):
        """Lambda ``name``'s log entries, oldest first: the newest ``limit`` (default 100)
        from ``since`` ("10m", Unix seconds or an RFC 3339 time), or only request ``request``'s.
        Each is a dict: ``type`` (start, out, error, report, dropped), ``message``,
        ``request_id``, ``time``..."""
        query = {k: v for k, v in (("since", since), ("limit", limit), ("request", request)) if v is not None}
        path = f"/logs/{urllib.parse.quote(name, safe='')}"
        if query:
            path += "?" + urllib.parse.urlencode(query)
        return self._check(self._call("GET", path)).json()["entries"]

    def request_logs(self, request_id):
        """The log entries of one request, whatever its lambda."""
        path = "/logs?" + urllib.parse.urlencode({"request": request_id})
        return self._check(self._call("GET", path)).json()["entries"]

    def history(self):
        """Each lambda's last hour, minute by minute (``GET /stats/history``)."""
        return self._check(self._call("GET", "/stats/history")).json()


def authorized(client, headers=None):
    """``headers`` (a copy) with ``client``'s API token as their Authorization, if it has one:
    for the worker's endpoints that need it (leases, blobs)."""
    headers = dict(headers or {})
    token = client.token()
    if token:
        headers["Authorization"] = f"Bearer {token.strip()}"
    return headers


_default_clients = {}


def as_client(client):
    """The :class:`Client` that ``client`` names: itself, a new one for a worker's URL, or for
    None the process's default client of ``$SPROUT_URL`` (or of the default URL), kept with its
    connections for the next map or lease."""
    if isinstance(client, Client):
        return client
    if client is None:
        url = os.environ.get("SPROUT_URL") or None
        key = url or ""
        if key not in _default_clients:
            _default_clients[key] = Client(url) if url else Client()
        return _default_clients[key]
    if isinstance(client, str):
        return Client(client)
    raise TypeError(f"client must be a sprout.Client or a URL, not {type(client).__name__}")
