"""The TLS client contexts Talon's HTTPS clients share.

Every ``httpx.AsyncClient`` (and every client of the model SDKs, which use ``httpx2``) builds
its own ``ssl.SSLContext`` unless it is given one, and building one loads the whole CA bundle:
about 25 ms of CPU and a few hundred KB each time, for every channel, download helper,
provider and doctor check. Here each library's own default context is made once, by the
library's own function (so the trust is exactly the library's default: ``httpx`` trusts
certifi's bundle, ``httpx2`` the system's store, and both honour ``SSL_CERT_FILE`` and
``SSL_CERT_DIR``, read when the context is first made), and shared. An ``SSLContext`` holds
settings and certificates, not connections: sharing it between clients and threads is what the
ssl module intends.
"""

from __future__ import annotations

import functools
import ssl


@functools.cache
def httpx_tls() -> ssl.SSLContext:
    """``httpx``'s default client context, made once (pass as ``verify=``)."""
    import httpx

    return httpx.create_ssl_context()


@functools.cache
def sdk_tls() -> ssl.SSLContext:
    """``httpx2``'s default client context (the openai, anthropic and mcp SDKs' HTTP library),
    made once (pass as ``verify=``)."""
    import httpx2  # type: ignore[import-not-found, unused-ignore]

    context: ssl.SSLContext = httpx2.create_ssl_context()
    return context
