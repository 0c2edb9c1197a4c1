"""A small async Kubernetes REST client for the executor, and the one connection
description that both it and kopf log in with (in-cluster or kubeconfig)."""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from json import dumps, loads
from pathlib import Path
from typing import Any, cast

import aiohttp
import kopf

from meshnet.api import labels
from meshnet.errors import KubeApiError, OperatorError

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
MERGE_PATCH = "application/merge-patch+json"


@dataclass(frozen=True)
class Connection:
    """Where the API server is and how to authenticate to it."""

    server: str
    token: str | None = None
    token_path: Path | None = None  # re-read on every request: projected tokens rotate
    ca_path: str | None = None
    cert_path: str | None = None
    key_path: str | None = None
    insecure: bool = False

    @classmethod
    def discover(cls, kubeconfig: str | None = None) -> Connection:
        """In-cluster service account when running in a pod, else the kubeconfig."""
        host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get(
            "KUBERNETES_SERVICE_PORT", "443")
        if host and kubeconfig is None and (SERVICE_ACCOUNT / "token").is_file():
            return cls(server=f"https://{host}:{port}", token_path=SERVICE_ACCOUNT / "token",
                       ca_path=str(SERVICE_ACCOUNT / "ca.crt"))
        return cls._from_kubeconfig(kubeconfig)

    @classmethod
    def _from_kubeconfig(cls, path: str | None) -> Connection:
        from kubernetes import client, config  # only needed outside the cluster

        cfg = client.Configuration()
        try:
            config.load_kube_config(config_file=path, client_configuration=cfg)
        except Exception as exc:  # the loader raises several unrelated types
            raise OperatorError(f"cannot load kubeconfig: {exc}") from exc
        bearer = (cfg.api_key or {}).get("authorization", "")
        return cls(server=cfg.host, token=bearer.removeprefix("Bearer ") or None,
                   ca_path=cfg.ssl_ca_cert, cert_path=cfg.cert_file, key_path=cfg.key_file,
                   insecure=not cfg.verify_ssl)

    def current_token(self) -> str | None:
        return self.token_path.read_text().strip() if self.token_path else self.token

    def kopf_info(self) -> kopf.ConnectionInfo:
        return kopf.ConnectionInfo(
            server=self.server, token=self.current_token(), ca_path=self.ca_path,
            certificate_path=self.cert_path, private_key_path=self.key_path,
            insecure=self.insecure or None, scheme="Bearer" if self.current_token() else None,
        )


def path(api_version: str, plural: str, namespace: str, name: str = "", sub: str = "") -> str:
    """/api/v1/namespaces/ns/pods/name or /apis/group/version/namespaces/ns/plural/name."""
    base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    return "/".join(p for p in (base, "namespaces", namespace, plural, name, sub) if p)


class KubeClient:
    """get / create / patch / delete; 404 and 409 are answers, not failures, where apt.

    On aiohttp (as kopf itself): httpx's connection pool checked every pooled connection
    on each request, which was a third of the operator's CPU with hundreds of routes."""

    def __init__(self, connection: Connection, timeout: float = 30.0) -> None:
        self._connection = connection
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._ssl = _ssl_context(connection) if connection.server.startswith("https") else True
        self._session: aiohttp.ClientSession | None = None  # made inside the running loop

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                base_url=self._connection.server.rstrip("/") + "/", timeout=self._timeout,
                connector=aiohttp.TCPConnector(limit=32, ssl=self._ssl))
        return self._session

    async def _request(self, method: str, url: str, *, json: Any = None,
                       params: Mapping[str, str] | None = None,
                       content_type: str | None = None) -> tuple[int, Any]:
        headers = {"Accept": "application/json"}
        token = self._connection.current_token()  # re-read: projected tokens rotate
        if token:
            headers["Authorization"] = f"Bearer {token}"
        data = None
        if json is not None:
            data = dumps(json).encode()
            headers["Content-Type"] = content_type or "application/json"
        async with self._http().request(method, url.lstrip("/"), data=data, params=params,
                                        headers=headers) as response:
            text = await response.text()
            if response.status == 404 and method in ("GET", "DELETE"):
                return 404, None
            if response.status == 409 and method == "POST":
                return 409, None
            if response.status >= 400:
                try:
                    message = loads(text).get("message", text)
                except (ValueError, AttributeError):
                    message = text
                raise KubeApiError(response.status, f"{method} {url.split('?')[0]}: {message}")
            return response.status, loads(text)

    async def get(self, url: str) -> dict[str, Any] | None:
        _, body = await self._request("GET", url)
        return cast(dict[str, Any] | None, body)

    async def create(self, url: str, body: Mapping[str, Any]) -> dict[str, Any] | None:
        """The object as created; None when one of that name already exists (our names
        are deterministic)."""
        _, created = await self._request("POST", url, json=body, params=_manager())
        return cast(dict[str, Any] | None, created)

    async def patch(self, url: str, body: Mapping[str, Any]) -> dict[str, Any]:
        _, patched = await self._request("PATCH", url, json=body, params=_manager(),
                                         content_type=MERGE_PATCH)
        return cast(dict[str, Any], patched)

    async def delete(self, url: str) -> bool:
        """False when it was already gone."""
        status, _ = await self._request("DELETE", url,
                                        params={"propagationPolicy": "Background"})
        return status != 404

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


def _ssl_context(connection: Connection) -> ssl.SSLContext:
    """The server's CA (or the system's), the client certificate if any; none when insecure."""
    context = ssl.create_default_context(cafile=connection.ca_path)
    if connection.insecure:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if connection.cert_path:
        context.load_cert_chain(connection.cert_path, connection.key_path)
    return context


def _manager() -> dict[str, str]:
    return {"fieldManager": labels.FIELD_MANAGER}
