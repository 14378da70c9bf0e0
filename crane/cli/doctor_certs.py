"""``crane doctor``'s certificate checks (``cryptography``): the files are readable PEM, the
certificate is within its validity period (and not about to leave it), the private key is the
certificate's, and the CA signed it. A TLS handshake fails on each of these with a message that
rarely names the file; this names it and says what to do.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization

from crane.cli.doctor_findings import FAIL, OK, WARN, Finding

__all__ = ["EXPIRY_WARNING", "check_tls_files"]

#: A certificate that expires sooner than this is a warning (renew before it fails handshakes).
EXPIRY_WARNING = dt.timedelta(days=30)

_RENEW = "issue a new one from your CA (e.g. `openssl x509 -req -days 365 ...`) and restart"


def _read(what: str, path: str, check: str) -> tuple[bytes | None, Finding | None]:
    try:
        return Path(path).read_bytes(), None
    except OSError as e:
        fix = f"check the path and its permissions: `ls -l {path}` (its reader must open it)"
        return None, Finding(check, FAIL, f"{what} {path} cannot be read: {e.strerror or e}", fix)


def _load_cert(data: bytes) -> x509.Certificate:
    return x509.load_pem_x509_certificate(data)


def check_tls_files(
    cert: str,
    key: str,
    ca: str,
    role: str,
    now: dt.datetime | None = None,
    ca_required: bool = True,
) -> list[Finding]:
    """Findings for one certificate, its key and the CA that should have signed it; ``role``
    names them ("craned", "guest client"). ``ca_required``: a CA that did not sign the
    certificate is a failure (else a warning)."""
    now = now or dt.datetime.now(dt.UTC)
    check = f"{role} certificate"
    out: list[Finding] = []
    cert_data, bad = _read("certificate", cert, check)
    if bad:
        return [bad]
    assert cert_data is not None
    try:
        certificate = _load_cert(cert_data)
    except ValueError as e:
        fix = f"`openssl x509 -in {cert} -noout -text` shows what it holds; it must be PEM"
        return [Finding(check, FAIL, f"{cert} is not a PEM certificate: {e}", fix)]
    subject = certificate.subject.rfc4514_string() or "(no subject)"
    start, end = certificate.not_valid_before_utc, certificate.not_valid_after_utc
    if now < start:
        out.append(
            Finding(
                check,
                FAIL,
                f"{cert} ({subject}) is not valid before {start:%Y-%m-%d %H:%M} UTC",
                "check this machine's clock (`timedatectl`), or " + _RENEW,
            )
        )
    elif now > end:
        out.append(
            Finding(check, FAIL, f"{cert} ({subject}) expired on {end:%Y-%m-%d %H:%M} UTC", _RENEW)
        )
    elif end - now < EXPIRY_WARNING:
        out.append(
            Finding(check, WARN, f"{cert} ({subject}) expires on {end:%Y-%m-%d} UTC", _RENEW)
        )
    else:
        out.append(Finding(check, OK, f"{cert} ({subject}), valid until {end:%Y-%m-%d}"))

    key_check = f"{role} key"
    key_data, bad = _read("private key", key, key_check)
    if bad:
        out.append(bad)
    else:
        assert key_data is not None
        try:
            private = serialization.load_pem_private_key(key_data, password=None)
        except (ValueError, TypeError) as e:
            out.append(
                Finding(
                    key_check,
                    FAIL,
                    f"{key} is not an unencrypted PEM private key: {e}",
                    f"`openssl pkey -in {key} -out {key}.plain` (craned reads no passphrase)",
                )
            )
        else:
            pub = serialization.PublicFormat.SubjectPublicKeyInfo
            enc = serialization.Encoding.DER
            if private.public_key().public_bytes(enc, pub) != certificate.public_key().public_bytes(
                enc, pub
            ):
                out.append(
                    Finding(
                        key_check,
                        FAIL,
                        f"{key} is not the private key of {cert}",
                        "configure the key the certificate was issued for, or issue a "
                        "certificate for this key",
                    )
                )
            else:
                out.append(Finding(key_check, OK, f"{key} matches the certificate"))

    ca_check = f"{role} CA"
    ca_data, bad = _read("CA", ca, ca_check)
    if bad:
        out.append(bad)
        return out
    assert ca_data is not None
    try:
        authorities = x509.load_pem_x509_certificates(ca_data)
    except ValueError as e:
        out.append(
            Finding(
                ca_check,
                FAIL,
                f"{ca} holds no PEM certificate: {e}",
                "point it at the CA's PEM file",
            )
        )
        return out
    for authority in authorities:
        try:
            certificate.verify_directly_issued_by(authority)
        except (ValueError, TypeError, InvalidSignature):
            continue
        name = authority.subject.rfc4514_string()
        out.append(Finding(ca_check, OK, f"{cert} is signed by {name} ({ca})"))
        return out
    issuer = certificate.issuer.rfc4514_string()
    out.append(
        Finding(
            ca_check,
            FAIL if ca_required else WARN,
            f"{cert} was not signed by any certificate in {ca} (its issuer: {issuer})",
            f"use the CA that issued it (`openssl verify -CAfile {ca} {cert}` must say OK), "
            "or issue the certificate from this CA",
        )
    )
    return out
