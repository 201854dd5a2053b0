"""TLS contexts for every listener and dialler of the project: a ledger node's (peers and
clients) and, through ``remoting.tls``, the nameservers' and brokers'.

Peer membership is proven by the cluster secret (``ledger.auth``); TLS adds confidentiality and
lets an operator require client certificates. Every node presents its certificate both
when it listens and when it dials, and checks the other side against the configured CA,
including the host name (or IP address) it dialled.
"""

from __future__ import annotations

import os
import ssl

from common.settings import ConfigError


def _load_chain(ctx: ssl.SSLContext, cert_file: str, key_file: str) -> None:
    try:
        ctx.load_cert_chain(cert_file, key_file)
    except FileNotFoundError as exc:
        # ssl leaves exc.filename unset: find out which of the two is missing to name it
        missing = exc.filename or next((f for f in (cert_file, key_file) if not os.path.exists(f)), cert_file)
        raise ConfigError(f"key 'tls_cert_file'/'tls_key_file': {missing} does not exist") from None
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(
            f"key 'tls_cert_file'/'tls_key_file': cannot load {cert_file} with {key_file}: {exc}"
        ) from None


def _load_ca(ctx: ssl.SSLContext, ca_file: str) -> None:
    try:
        ctx.load_verify_locations(cafile=ca_file)
    except FileNotFoundError:
        raise ConfigError(f"key 'tls_ca_file': {ca_file} does not exist") from None
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(f"key 'tls_ca_file': cannot load {ca_file}: {exc}") from None


def server_context(cert_file: str, key_file: str, ca_file: str, require_client_cert: bool) -> ssl.SSLContext:
    """The listener's context: our certificate; client certificates checked against the CA."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    _load_chain(ctx, cert_file, key_file)
    if ca_file:
        _load_ca(ctx, ca_file)
        ctx.verify_mode = ssl.CERT_REQUIRED if require_client_cert else ssl.CERT_OPTIONAL
    return ctx


def client_context(ca_file: str, cert_file: str = "", key_file: str = "") -> ssl.SSLContext:
    """A dialer's context: the server must hold a certificate from ``ca_file`` for the dialled host."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    _load_ca(ctx, ca_file)
    if cert_file:
        _load_chain(ctx, cert_file, key_file)
    return ctx
