"""The download's HTTP GET: the token goes to the hub's host only, errors are the hub's."""

from __future__ import annotations

import urllib.request

import pytest

from core.models.hub import http_get


def _redirected(url: str, to: str) -> urllib.request.Request:
    request = urllib.request.Request(url)
    request.add_unredirected_header("Authorization", "Bearer hf_secret")
    request.add_header("Range", "bytes=10-")
    return http_get._Redirect().redirect_request(request, None, 302, "Found", {}, to)


def test_a_redirect_to_another_host_drops_the_token():
    new = _redirected(
        "https://huggingface.co/org/m/resolve/abc/model.safetensors",
        "https://cdn-lfs.hf.co/repos/xy/model.safetensors?sig=1",
    )
    assert new.get_header("Authorization") is None
    assert new.get_header("Range") == "bytes=10-"  # the resume still asks for the rest only


def test_a_redirect_on_the_same_host_keeps_the_token():
    new = _redirected(
        "https://huggingface.co/old-org/m/resolve/abc/model.safetensors",
        "https://huggingface.co/new-org/m/resolve/abc/model.safetensors",
    )
    assert new.get_header("Authorization") == "Bearer hf_secret"


def test_http_errors_are_huggingface_hubs(loopback_hub):
    from huggingface_hub import errors

    from tests.core.models.hub.hub_fixture import GATED

    url = f"{loopback_hub.url}/{GATED}/resolve/main/config.json"
    with pytest.raises(errors.GatedRepoError):
        http_get.open_get(url, {}, timeout=5)
    with pytest.raises(errors.RepositoryNotFoundError):
        http_get.open_get(
            f"{loopback_hub.url}/nobody/nothing/resolve/main/config.json", {}, timeout=5
        )


def test_a_refused_connection_is_a_network_error():
    from tests.core.models.hub.hub_fixture import free_port_url

    with pytest.raises(http_get.network_errors()):
        http_get.open_get(free_port_url() + "/x", {}, timeout=5)
