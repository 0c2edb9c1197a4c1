"""The operator's API client against a real HTTP server: what it sends (bearer token,
field manager, patch content types) and how it reads the answers."""

from __future__ import annotations

import shutil
import ssl
import subprocess
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from meshnet.errors import KubeApiError
from meshnet.operator.kube import MERGE_PATCH, Connection, KubeClient


@pytest.fixture
async def server() -> Any:
    seen: list[dict[str, Any]] = []

    async def handle(request: web.Request) -> web.Response:
        body = await request.json() if request.can_read_body else None
        seen.append({"method": request.method, "path": request.path,
                     "query": dict(request.query), "body": body,
                     "auth": request.headers.get("Authorization"),
                     "type": request.headers.get("Content-Type")})
        name = request.path.rsplit("/", 1)[-1]
        if name == "missing":
            return web.json_response({"message": "not found"}, status=404)
        if request.method == "POST" and body["metadata"]["name"] == "taken":
            return web.json_response({"message": "exists"}, status=409)
        if name == "broken":
            return web.json_response({"message": "the server is on fire"}, status=500)
        return web.json_response({"metadata": {"name": name}, "echo": body})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield f"http://127.0.0.1:{port}", seen
    await runner.cleanup()


async def test_requests_carry_the_current_token_and_our_field_manager(
        server: Any, tmp_path: Path) -> None:
    url, seen = server
    token = tmp_path / "token"
    token.write_text("first\n")
    client = KubeClient(Connection(server=url, token_path=token))
    try:
        assert (await client.get("/api/v1/namespaces/ns/pods/p"))["metadata"]["name"] == "p"
        token.write_text("rotated")
        pod = {"metadata": {"name": "p"}}
        assert (await client.create("/api/v1/namespaces/ns/pods", pod))["echo"] == pod
        await client.patch("/api/v1/namespaces/ns/pods/p", {"status": {}})
        assert await client.delete("/api/v1/namespaces/ns/pods/p")
    finally:
        await client.close()
    assert [s["auth"] for s in seen] == ["Bearer first"] + ["Bearer rotated"] * 3
    assert [s["query"].get("fieldManager") for s in seen[1:3]] == ["meshnet-operator"] * 2
    assert seen[2]["type"] == MERGE_PATCH
    assert seen[3]["query"] == {"propagationPolicy": "Background"}


async def test_missing_and_existing_objects_are_answers_and_errors_name_the_request(
        server: Any) -> None:
    url, seen = server
    client = KubeClient(Connection(server=url))
    try:
        assert await client.get("/api/v1/namespaces/ns/pods/missing") is None
        assert not await client.delete("/api/v1/namespaces/ns/pods/missing")
        assert await client.create("/api/v1/namespaces/ns/pods",
                                   {"metadata": {"name": "taken"}}) is None
        with pytest.raises(KubeApiError) as failed:
            await client.patch("/api/v1/namespaces/ns/pods/broken", {})
        with pytest.raises(KubeApiError):  # a 404 on a write is a failure
            await client.patch("/api/v1/namespaces/ns/pods/missing", {})
    finally:
        await client.close()
    assert failed.value.status == 500
    assert "PATCH /api/v1/namespaces/ns/pods/broken: the server is on fire" in str(failed.value)
    assert all(s["auth"] is None for s in seen)  # no token: no header


async def test_a_server_address_with_a_path_prefix_keeps_it(server: Any) -> None:
    url, seen = server  # e.g. a Rancher-style proxy: https://host/k8s/clusters/c-1
    client = KubeClient(Connection(server=f"{url}/k8s/clusters/c-1/"))
    try:
        await client.get("/api/v1/namespaces/ns/pods/p?resourceVersion=0")
    finally:
        await client.close()
    assert seen[0]["path"] == "/k8s/clusters/c-1/api/v1/namespaces/ns/pods/p"
    assert seen[0]["query"] == {"resourceVersion": "0"}


def _certificates(folder: Path) -> None:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, both signed by it."""
    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=folder, check=True, capture_output=True)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=ca",
            "-keyout", "ca.key", "-out", "ca.crt")
    (folder / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    for who, extra in (("server", ["-extfile", "san.ext"]), ("client", [])):
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={who}",
                "-keyout", f"{who}.key", "-out", f"{who}.csr")
        openssl("x509", "-req", "-in", f"{who}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                "-CAcreateserial", "-days", "1", "-out", f"{who}.crt", *extra)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
async def test_tls_verifies_the_server_against_the_ca_and_presents_the_client_certificate(
        tmp_path: Path) -> None:
    _certificates(tmp_path)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=tmp_path / "ca.crt")
    context.load_cert_chain(tmp_path / "server.crt", tmp_path / "server.key")
    context.verify_mode = ssl.CERT_REQUIRED  # no client certificate, no answer

    async def handle(request: web.Request) -> web.Response:
        peer = request.transport.get_extra_info("peercert")  # type: ignore[union-attr]
        return web.json_response({"client": dict(x[0] for x in peer["subject"])["commonName"]})

    app = web.Application()
    app.router.add_get("/{tail:.*}", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    url = f"https://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
    client = KubeClient(Connection(server=url, ca_path=str(tmp_path / "ca.crt"),
                                   cert_path=str(tmp_path / "client.crt"),
                                   key_path=str(tmp_path / "client.key")))
    stranger = KubeClient(Connection(server=url))  # the system's CAs: not ours
    insecure = KubeClient(Connection(server=url, insecure=True,
                                     cert_path=str(tmp_path / "client.crt"),
                                     key_path=str(tmp_path / "client.key")))
    try:
        assert await client.get("/version") == {"client": "client"}
        with pytest.raises(Exception, match="certificate verify failed"):
            await stranger.get("/version")
        assert await insecure.get("/version") == {"client": "client"}  # not verified
    finally:
        await client.close()
        await stranger.close()
        await insecure.close()
        await runner.cleanup()
