"""Each route's own CA and identities (meshnet.pki) as the operator issues and renews them,
and a real worker started with the flags and files a stage pod gets from them: it refuses
a plaintext caller and a caller holding another route's identity, and serves the route's
gateway."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from meshnet import pki
from meshnet.api.shardroute import LayerRange, Recipe, Stage
from meshnet.local.process import LaunchSpec, WorkerProcess
from meshnet.reconcile.route.identity import (
    GATEWAY,
    STAGE,
    IssuedIdentity,
    link_tls,
    stage_hosts,
    stage_server_name,
    tls_volume,
)
from meshnet.reconcile.route.planner import stage_worker
from meshnet.reconcile.route.worker_command import worker_command
from meshnet.reconcile.route.workerspec import Identities
from meshnet.route import RouteDriver
from meshnet.route.stage import StageClient, StageError, TlsFiles
from meshnet.timestamps import utc_now

NS = "ml"
NOW = datetime(2026, 12, 7, 8, 0, tzinfo=UTC)


def subject(route: str, replicas: int = 1) -> pki.Subject:
    return pki.Subject(NS, route, stage_hosts(route, NS, replicas))


def cert(data: Mapping[str, bytes], role: str) -> x509.Certificate:
    return x509.load_pem_x509_certificate(data[pki.cert_key(role)])


def usages(certificate: x509.Certificate) -> set[Any]:
    return set(certificate.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)


def test_a_route_gets_its_own_ca_and_a_leaf_per_role_that_only_does_its_job() -> None:
    data = pki.issue(subject("r1"), NOW)
    assert pki.renewal_due(data, subject("r1"), NOW) is None
    ca = x509.load_pem_x509_certificate(data[pki.CA_CERT])
    for role in pki.ROLES:
        leaf = cert(data, role)
        leaf.verify_directly_issued_by(ca)
        assert leaf.subject.rfc4514_string().startswith(f"CN={role}.r1.{NS}")
    stage = cert(data, pki.STAGE)
    assert usages(stage) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}
    names = stage.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert {"stage.r1.ml", "*.r1-workers.ml.svc", "*.r1-workers-r1.ml.svc"} <= set(
        names.get_values_for_type(x509.DNSName))
    for role in (pki.GATEWAY, pki.CERTIFY, pki.OPERATOR):  # a leaked one serves no stage
        assert usages(cert(data, role)) == {ExtendedKeyUsageOID.CLIENT_AUTH}
    assert len(data[pki.ROUTE_KEY]) == 64 and int(data[pki.ROUTE_KEY], 16) >= 0
    other = pki.issue(subject("r2"), NOW)
    assert other[pki.CA_CERT] != data[pki.CA_CERT] and other[pki.ROUTE_KEY] != data[pki.ROUTE_KEY]


def test_leaves_are_renewed_under_the_same_ca_before_they_expire_and_when_the_route_grows(
        ) -> None:
    data = pki.issue(subject("r1"), NOW)
    later = NOW + pki.LEAF_LIFETIME - pki.RENEW_BEFORE + timedelta(days=1)
    assert pki.renewal_due(data, subject("r1"), later - timedelta(days=2)) is None
    assert "expires" in str(pki.renewal_due(data, subject("r1"), later))
    renewed = pki.issue(subject("r1"), later, data)
    assert renewed[pki.CA_CERT] == data[pki.CA_CERT]  # running peers keep trusting it
    assert renewed[pki.ROUTE_KEY] == data[pki.ROUTE_KEY]
    assert renewed[pki.cert_key(pki.STAGE)] != data[pki.cert_key(pki.STAGE)]
    assert pki.renewal_due(renewed, subject("r1"), later) is None
    assert "replica" in str(pki.renewal_due(data, subject("r1", replicas=17), NOW))


def test_no_pod_mounts_the_ca_key() -> None:
    tls = link_tls(None, IssuedIdentity("r1-identity", "t"))
    assert tls is not None and tls.require_client_cert
    for role in pki.ROLES:
        items = tls_volume(tls, role)["secret"]["items"]
        assert pki.CA_KEY not in {item["key"] for item in items}
        assert {item["path"] for item in items} == {"ca.crt", "tls.crt", "tls.key"}


def mounted(data: Mapping[str, bytes], role: str, folder: Path) -> Path:
    """The files a pod of `role` sees where its tls volume is mounted, as the kubelet lays
    out the Secret's items."""
    tls = link_tls(None, IssuedIdentity("r1-identity", "t"))
    assert tls is not None
    folder.mkdir()
    for item in tls_volume(tls, role)["secret"]["items"]:
        (folder / item["path"]).write_bytes(data[item["key"]])
    return folder


def client(folder: Path | None, endpoint: str) -> StageClient:
    if folder is None:
        return StageClient(endpoint, timeout=5)
    return StageClient(endpoint, TlsFiles(folder / "ca.crt", folder / "tls.crt",
                                          folder / "tls.key", stage_server_name("r1", NS)),
                       timeout=5)


def test_a_stage_on_its_routes_identity_refuses_plaintext_and_other_routes_and_serves_its_gateway(
        shard_worker: Path, smollm2: Path, tmp_path: Path) -> None:
    mine = pki.issue(subject("r1"), utc_now())  # the workers check validity on this clock
    theirs = pki.issue(subject("r2"), utc_now())
    tls = link_tls(None, IssuedIdentity("r1-identity", "t"))  # a route without spec.tls
    worker = stage_worker([Stage(name="s0", layers=LayerRange(begin=0, end=30))], 0,
                          Recipe(), tls, 1, Identities("a" * 64, "b" * 64, "c" * 64),
                          smollm2.name, f"{NS}/r1")
    command = worker_command(worker, smollm2, "127.0.0.1:0", "127.0.0.1:0", {},
                             mounted(mine, STAGE, tmp_path / "stage"))
    assert "--tls-client-ca" in command.args()  # mTLS, as the pod renders it
    gateway = mounted(mine, GATEWAY, tmp_path / "gateway")
    # another route's gateway, trusting this route's CA (a CA certificate is no secret)
    stranger = mounted(theirs, GATEWAY, tmp_path / "stranger")
    (stranger / "ca.crt").write_bytes(mine[pki.CA_CERT])
    with WorkerProcess(shard_worker, LaunchSpec.of(command, threads=1)).start() as stage:
        for refused in (None, stranger):
            caller = client(refused, stage.endpoint)
            with pytest.raises(StageError) as caught:
                caller.info()
            assert caught.value.code == "UNAVAILABLE", refused
            caller.close()
        accepted = client(gateway, stage.endpoint)
        assert accepted.info().route_id == f"{NS}/r1"
        accepted.close()
        files = TlsFiles(gateway / "ca.crt", gateway / "tls.crt", gateway / "tls.key",
                         stage_server_name("r1", NS))
        with RouteDriver([stage.endpoint], tls=files) as driver:
            assert len(driver.generate([1, 2, 3], max_tokens=2, stop_at_eos=False).tokens) == 2
