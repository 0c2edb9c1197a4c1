"""A small async Kubernetes REST client for the executor, and the one connection
description that both it and kopf log in with (in-cluster or kubeconfig)."""

from __future__ import annotations

import os
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import kopf

from meshnet.api import labels
from meshnet.errors import KubeApiError, OperatorError

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"


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


class _BearerAuth(httpx.Auth):
    def __init__(self, connection: Connection) -> None:
        self.connection = connection

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        token = self.connection.current_token()
        if token:
            request.headers["Authorization"] = f"Bearer {token}"
        yield request


def path(api_version: str, plural: str, namespace: str, name: str = "", sub: str = "") -> str:
    """/api/v1/namespaces/ns/pods/name or /apis/group/version/namespaces/ns/plural/name."""
    base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    return "/".join(p for p in (base, "namespaces", namespace, plural, name, sub) if p)


class KubeClient:
    """get / create / patch / delete; 404 and 409 are answers, not failures, where apt."""

    def __init__(self, connection: Connection, timeout: float = 30.0) -> None:
        verify: Any = False if connection.insecure else (connection.ca_path or True)
        cert: str | tuple[str, str] | None = connection.cert_path
        if connection.cert_path and connection.key_path:
            cert = (connection.cert_path, connection.key_path)
        self._http = httpx.AsyncClient(base_url=connection.server, auth=_BearerAuth(connection),
                                       verify=verify, cert=cert, timeout=timeout,
                                       limits=httpx.Limits(max_connections=32,
                                                           max_keepalive_connections=32))

    async def get(self, url: str) -> dict[str, Any] | None:
        response = await self._http.get(url)
        return None if response.status_code == 404 else _json(response)

    async def create(self, url: str, body: Mapping[str, Any]) -> dict[str, Any] | None:
        """The object as created; None when one of that name already exists (our names
        are deterministic)."""
        response = await self._http.post(url, json=body, params=_manager())
        if response.status_code == 409:
            return None
        return _json(response)

    async def patch(self, url: str, body: Mapping[str, Any]) -> dict[str, Any]:
        response = await self._http.patch(url, json=body, params=_manager(),
                                          headers={"Content-Type": MERGE_PATCH})
        return _json(response)

    async def json_patch(self, url: str, operations: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """An RFC 6902 patch: its `test` operations make a write conditional (422 if not)."""
        response = await self._http.patch(url, json=list(operations), params=_manager(),
                                          headers={"Content-Type": JSON_PATCH})
        return _json(response)

    async def delete(self, url: str) -> bool:
        """False when it was already gone."""
        response = await self._http.delete(url, params={"propagationPolicy": "Background"})
        if response.status_code == 404:
            return False
        _json(response)
        return True

    async def close(self) -> None:
        await self._http.aclose()


def _manager() -> dict[str, str]:
    return {"fieldManager": labels.FIELD_MANAGER}


def _json(response: httpx.Response) -> dict[str, Any]:
    if response.status_code >= 400:
        try:
            message = response.json().get("message", response.text)
        except ValueError:
            message = response.text
        raise KubeApiError(response.status_code, f"{response.request.method}"
                           f" {response.request.url.path}: {message}")
    data: dict[str, Any] = response.json()
    return data
