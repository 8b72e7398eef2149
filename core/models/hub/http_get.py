"""One HTTP(S) GET whose body the caller reads with ``readinto`` into its own buffers.

huggingface_hub's HTTP client (httpx) hands a body over in 64 KB ``bytes`` objects that
pass through its HTTP/1.1 parser: for a 500 MB file that is ~8000 Python-level chunks,
each allocated and copied, which on a loopback link cost more CPU than the transfer
itself. The standard library's ``http.client`` response reads straight from the socket
into a buffer the caller reuses (``recv_into``). ``urllib.request`` opens it, so the
proxies the environment names (``HTTPS_PROXY``, ``NO_PROXY``...) and redirects are
handled as Python handles them; the token goes only to the host it was meant for (a
redirect to the hub's CDN drops it, as huggingface_hub's client does). An HTTP error
becomes huggingface_hub's own typed error (gated, no such repo...), so callers map it
the same way as any other hub error.
"""

from __future__ import annotations

import http.client
import ssl
import urllib.error
import urllib.request
from functools import lru_cache
from urllib.parse import urlsplit

MAX_REDIRECTS = 10


def network_errors() -> tuple[type[BaseException], ...]:
    """What a lost or refused connection raises here (HTTP errors are raised as
    huggingface_hub's errors instead)."""
    return (urllib.error.URLError, http.client.HTTPException, ConnectionError, TimeoutError)


def open_get(url: str, headers: dict[str, str], timeout: float) -> http.client.HTTPResponse:
    """GET ``url``; the open response (status 2xx), positioned at the body. Raises
    huggingface_hub's ``HfHubHTTPError`` family for an HTTP error, a
    :func:`network_errors` error for a connection that fails."""
    request = urllib.request.Request(url, method="GET")
    for name, value in headers.items():
        if name.lower() == "authorization":
            # _Redirect passes it on to the same host only
            request.add_unredirected_header(name, value)
        else:
            request.add_header(name, value)
    try:
        return _opener().open(request, timeout=timeout)
    except urllib.error.HTTPError as error:
        raise_hub_error(error, url)
        raise  # not reached: raise_hub_error raises


def raise_hub_error(error: urllib.error.HTTPError, url: str) -> None:
    """Raise what huggingface_hub raises for this answer (it reads the status and the
    hub's ``X-Error-Code`` header)."""
    import httpx2
    from huggingface_hub.utils import hf_raise_for_status

    try:
        body = error.read()
    except (OSError, http.client.HTTPException):
        body = b""
    finally:
        error.close()
    response = httpx2.Response(
        error.code,
        headers=list(error.headers.items()),
        content=body,
        request=httpx2.Request("GET", error.url or url),
    )
    hf_raise_for_status(response)
    raise urllib.error.URLError(f"HTTP {error.code}")  # a status huggingface_hub lets through (3xx)


class _Redirect(urllib.request.HTTPRedirectHandler):
    """Follow redirects; keep the token (an unredirected header) only while the host
    stays the same."""

    max_redirections = MAX_REDIRECTS

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None and urlsplit(newurl).netloc == urlsplit(req.full_url).netloc:
            for name, value in req.unredirected_hdrs.items():
                if name.lower() == "authorization":
                    new.add_unredirected_header(name, value)
        return new


class _HTTPS(urllib.request.HTTPSHandler):
    """HTTPS with :func:`_tls_context`, made at the first https URL (loading the
    certificates takes tens of milliseconds: a plain-HTTP hub never needs them)."""

    def https_open(self, req):
        return self.do_open(http.client.HTTPSConnection, req, context=_tls_context())


def _opener() -> urllib.request.OpenerDirector:
    """Built per request: its ProxyHandler reads the environment's proxies now."""
    return urllib.request.build_opener(_Redirect(), _HTTPS())


@lru_cache(maxsize=1)
def _tls_context() -> ssl.SSLContext:
    """Certificates from certifi (what httpx uses: a Python from python.org on macOS has
    none of its own until its installer's script runs), else the system's."""
    try:
        import certifi
    except ImportError:
        return ssl.create_default_context()
    return ssl.create_default_context(cafile=certifi.where())
