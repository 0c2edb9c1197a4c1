"""A route's own certificate authority and the identities it signs (with `cryptography`).

Every route gets its own CA, so a certificate of one route is worth nothing at another's
stages. It signs one leaf per role, each with a key of its own: a stage identity (server
and client: stages serve and call each other) and client-only identities for the gateway,
for certification Jobs and for the operator (which samples the stages), so a leaked
gateway certificate cannot serve as a stage. The
operator keeps them in a Secret per route and renews the leaves (under the same CA) well
before they expire. (`meshnet up` runs plaintext on loopback: docs/local-backend.md.)
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_LIFETIME = timedelta(days=3650)
LEAF_LIFETIME = timedelta(days=365)
RENEW_BEFORE = timedelta(days=30)  # leaves are reissued once they have less left than this
BACKDATE = timedelta(minutes=5)  # clocks of the nodes may lag the operator's a little

STAGE, GATEWAY, CERTIFY, OPERATOR = "stage", "gateway", "certify", "operator"
ROLES = (STAGE, GATEWAY, CERTIFY, OPERATOR)
CA_CERT, CA_KEY, ROUTE_KEY = "ca.crt", "ca.key", "route.key"
ROUTE_KEY_BYTES = 32


def cert_key(role: str) -> str:
    return f"{role}.crt"


def key_key(role: str) -> str:
    return f"{role}.key"


@dataclass(frozen=True)
class Subject:
    """Whom a route's identities name: the route `route` in `namespace`, and the DNS names
    its stages are reached by (wildcards such as *.r-workers.ns.svc). The stage
    certificate also names `stage.<route>.<namespace>`: what a caller that dials a pod IP
    checks it against."""

    namespace: str
    route: str
    stage_hosts: tuple[str, ...]

    def common_name(self, role: str) -> str:
        return f"{role}.{self.route}.{self.namespace}"

    def uri(self, role: str) -> str:
        return f"meshnet://{self.namespace}/{self.route}/{role}"


def issue(subject: Subject, now: datetime,
          previous: Mapping[str, bytes] | None = None) -> dict[str, bytes]:
    """Every file of a route's identity: a CA (kept from `previous` while it has more than a
    leaf's lifetime left, so running peers keep trusting the new leaves), a leaf per role,
    and the route key (kept from `previous`)."""
    ca_key, ca_cert = _usable_ca(previous, now) or _new_ca(subject, now)
    data = {CA_CERT: _pem(ca_cert), CA_KEY: _key_pem(ca_key)}
    for role in ROLES:
        key = ec.generate_private_key(ec.SECP256R1())
        data[cert_key(role)] = _pem(_leaf(subject, role, key, ca_key, ca_cert, now))
        data[key_key(role)] = _key_pem(key)
    old_key = (previous or {}).get(ROUTE_KEY, b"")
    data[ROUTE_KEY] = old_key if _is_route_key(old_key) else new_route_key()
    return data


def new_route_key() -> bytes:
    """32 random bytes as 64 hex digits (what the stages and the driver compare)."""
    return secrets.token_hex(ROUTE_KEY_BYTES).encode()


def renewal_due(data: Mapping[str, bytes], subject: Subject, now: datetime) -> str | None:
    """Why the identity in `data` must be issued again (None: it serves as it is): a file
    missing or unreadable, a leaf expiring within RENEW_BEFORE, or a stage certificate that
    does not name every address the route's stages have now."""
    missing = [k for k in (CA_CERT, CA_KEY, ROUTE_KEY, *(f(r) for r in ROLES
                                                        for f in (cert_key, key_key)))
               if not data.get(k)]
    if missing:
        return f"it lacks {', '.join(missing)}"
    if not _is_route_key(data[ROUTE_KEY]):
        return "its route key is not 64 hex digits"
    try:
        certs = {role: x509.load_pem_x509_certificate(data[cert_key(role)]) for role in ROLES}
        ca = x509.load_pem_x509_certificate(data[CA_CERT])
    except ValueError as exc:
        return f"a certificate does not parse: {exc}"
    for role, cert in certs.items():
        if cert.issuer != ca.subject:
            return f"the {role} certificate is not signed by its CA"
        if cert.not_valid_after_utc - now < RENEW_BEFORE:
            return f"the {role} certificate expires {cert.not_valid_after_utc:%Y-%m-%d}"
    names = set(certs[STAGE].extensions.get_extension_for_class(
        x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName))
    if not set(subject.stage_hosts) <= names:
        return "the stage certificate does not name every replica's addresses"
    return None


def not_after(data: Mapping[str, bytes], role: str = STAGE) -> datetime:
    return x509.load_pem_x509_certificate(data[cert_key(role)]).not_valid_after_utc


def _usable_ca(previous: Mapping[str, bytes] | None,
               now: datetime) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate] | None:
    if not previous or not previous.get(CA_CERT) or not previous.get(CA_KEY):
        return None
    try:
        cert = x509.load_pem_x509_certificate(previous[CA_CERT])
        key = serialization.load_pem_private_key(previous[CA_KEY], password=None)
    except ValueError:
        return None
    if not isinstance(key, ec.EllipticCurvePrivateKey) \
            or cert.not_valid_after_utc - now < LEAF_LIFETIME + RENEW_BEFORE:
        return None
    return key, cert


def _new_ca(subject: Subject, now: datetime) -> tuple[ec.EllipticCurvePrivateKey,
                                                      x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "meshnet"),
                      x509.NameAttribute(NameOID.COMMON_NAME,
                                         f"meshnet route CA {subject.namespace}/{subject.route}")])
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - BACKDATE).not_valid_after(now + CA_LIFETIME)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False,
                                         key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, key_cert_sign=True, crl_sign=True,
                                         encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                           critical=False)
            .sign(key, hashes.SHA256()))
    return key, cert


def _leaf(subject: Subject, role: str, key: ec.EllipticCurvePrivateKey,
          ca_key: ec.EllipticCurvePrivateKey, ca_cert: x509.Certificate,
          now: datetime) -> x509.Certificate:
    """A stage serves and calls (server and client auth, named by the stages' addresses);
    the gateway and certification only call (client auth, no DNS name)."""
    usages: Sequence[x509.ObjectIdentifier] = (
        (ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH) if role == STAGE
        else (ExtendedKeyUsageOID.CLIENT_AUTH,))
    names: list[x509.GeneralName] = [x509.UniformResourceIdentifier(subject.uri(role))]
    if role == STAGE:
        names += [x509.DNSName(host) for host in (subject.common_name(STAGE),
                                                  *subject.stage_hosts)]
    name = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "meshnet"),
                      x509.NameAttribute(NameOID.COMMON_NAME, subject.common_name(role))])
    return (x509.CertificateBuilder().subject_name(name).issuer_name(ca_cert.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - BACKDATE)
            .not_valid_after(min(now + LEAF_LIFETIME, ca_cert.not_valid_after_utc))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False,
                                         key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, key_cert_sign=False,
                                         crl_sign=False, encipher_only=False,
                                         decipher_only=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage(list(usages)), critical=False)
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _is_route_key(value: bytes) -> bool:
    text = value.decode("ascii", "replace").strip()
    return len(text) == 2 * ROUTE_KEY_BYTES and all(c in "0123456789abcdef" for c in text)
