"""A real Matrix homeserver for the tests: Synapse (the ``matrix-synapse`` package) started on
loopback with a generated configuration in a temporary directory, SQLite, no federation, media
capped at ``UPLOAD_MAX_BYTES``. One homeserver serves the whole test run: under pytest-xdist the
first worker that needs it starts it and the others use it (its address in the run's directory,
under a file lock), and tests/support/keeper.py stops it when the run ends; tests register fresh users through the shared-secret admin API
(``/_synapse/admin/v1/register``), so they never see each other's rooms.

Start-up waits for ``/_matrix/client/versions`` to answer (a condition, never a fixed sleep) and
fails with the homeserver's own log when it does not come up in ``START_TIMEOUT_S``.
"""

from __future__ import annotations

import fcntl
import hashlib
import hmac
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.support.ports import free_port

START_TIMEOUT_S = 120.0
UPLOAD_MAX_BYTES = 2 * 1024 * 1024
SERVER_NAME = "localhost"


@dataclass(frozen=True)
class MatrixUser:
    user_id: str
    password: str
    access_token: str
    device_id: str

    @property
    def localpart(self) -> str:
        return self.user_id[1:].split(":", 1)[0]


class Synapse:
    """A running homeserver: its base URL, and users made on it."""

    def __init__(self, base_url: str, shared_secret: str, directory: Path,
                 process: subprocess.Popen[bytes] | None) -> None:
        self.base_url = base_url
        self._secret = shared_secret
        self.directory = directory
        self.process = process
        self._admin: MatrixUser | None = None

    def register(self, prefix: str = "user", *, admin: bool = False) -> MatrixUser:
        """A new user (a unique name starting with ``prefix``), logged in (its access token)."""
        localpart = f"{prefix}{secrets.token_hex(4)}"
        password = secrets.token_urlsafe(12)
        with httpx.Client(base_url=self.base_url, timeout=30.0) as http:
            nonce = http.get("/_synapse/admin/v1/register").json()["nonce"]
            mac = hmac.new(self._secret.encode(), digestmod=hashlib.sha1)
            mac.update(b"\x00".join([nonce.encode(), localpart.encode(), password.encode(),
                                     b"admin" if admin else b"notadmin"]))
            answer = http.post("/_synapse/admin/v1/register", json={
                "nonce": nonce, "username": localpart, "password": password, "admin": admin,
                "mac": mac.hexdigest()})
            answer.raise_for_status()
            body = answer.json()
        return MatrixUser(body["user_id"], password, body["access_token"], body["device_id"])

    @property
    def admin(self) -> MatrixUser:
        if self._admin is None:
            self._admin = self.register("admin", admin=True)
        return self._admin

    def limit_messages(self, user: MatrixUser, per_second: int, burst: int) -> None:
        """Give ``user`` a tight message rate limit of its own (the homeserver's admin API), so
        that it meets ``M_LIMIT_EXCEEDED`` quickly."""
        with httpx.Client(base_url=self.base_url, timeout=30.0) as http:
            answer = http.post(f"/_synapse/admin/v1/users/{user.user_id}/override_ratelimit",
                               json={"messages_per_second": per_second, "burst_count": burst},
                               headers={"Authorization": f"Bearer {self.admin.access_token}"})
            answer.raise_for_status()

    def log_tail(self, chars: int = 4000) -> str:
        path = self.directory / "homeserver.log"
        return path.read_text(errors="replace")[-chars:] if path.exists() else "(no log)"


def _config(directory: Path, port: int, secret: str) -> str:
    # Generous global rate limits (the tests register and talk a lot); a test that wants
    # M_LIMIT_EXCEEDED tightens one user's with ``Synapse.limit_messages``.
    return f"""
server_name: "{SERVER_NAME}"
pid_file: {directory}/homeserver.pid
public_baseurl: http://127.0.0.1:{port}/
listeners:
  - port: {port}
    bind_addresses: ['127.0.0.1']
    type: http
    tls: false
    x_forwarded: false
    resources:
      - names: [client]
        compress: false
database:
  name: sqlite3
  args:
    database: {directory}/homeserver.db
log_config: {directory}/log.yaml
media_store_path: {directory}/media
signing_key_path: {directory}/signing.key
registration_shared_secret: "{secret}"
macaroon_secret_key: "{secrets.token_hex(16)}"
form_secret: "{secrets.token_hex(16)}"
report_stats: false
trusted_key_servers: []
suppress_key_server_warning: true
enable_registration: false
federation_domain_whitelist: []
url_preview_enabled: false
max_upload_size: {UPLOAD_MAX_BYTES}
presence:
  enabled: false
rc_message:
  per_second: 1000
  burst_count: 1000
rc_login:
  address: {{per_second: 1000, burst_count: 1000}}
  account: {{per_second: 1000, burst_count: 1000}}
  failed_attempts: {{per_second: 1000, burst_count: 1000}}
rc_registration:
  per_second: 1000
  burst_count: 1000
rc_joins:
  local: {{per_second: 1000, burst_count: 1000}}
  remote: {{per_second: 1000, burst_count: 1000}}
rc_invites:
  per_room: {{per_second: 1000, burst_count: 1000}}
  per_user: {{per_second: 1000, burst_count: 1000}}
  per_issuer: {{per_second: 1000, burst_count: 1000}}
rc_media_create:
  per_second: 1000
  burst_count: 1000
"""


_LOG_CONFIG = """
version: 1
formatters:
  precise:
    format: '%(asctime)s %(name)s %(levelname)s %(message)s'
handlers:
  file:
    class: logging.FileHandler
    filename: {path}
    formatter: precise
root:
  level: WARNING
  handlers: [file]
disable_existing_loggers: false
"""


def start_synapse(directory: Path) -> Synapse:
    port = free_port()
    secret = secrets.token_hex(16)
    config = directory / "homeserver.yaml"
    config.write_text(_config(directory, port, secret))
    (directory / "log.yaml").write_text(_LOG_CONFIG.format(path=directory / "homeserver.log"))
    subprocess.run([sys.executable, "-m", "synapse.app.homeserver", "-c", str(config), "--generate-keys"],
                   check=True, capture_output=True, timeout=120)
    out = (directory / "stdout.log").open("wb")
    process = subprocess.Popen([sys.executable, "-m", "synapse.app.homeserver", "-c", str(config)],
                               stdout=out, stderr=subprocess.STDOUT, cwd=directory)
    base = f"http://127.0.0.1:{port}"
    server = Synapse(base, secret, directory, process)
    deadline = time.monotonic() + START_TIMEOUT_S
    with httpx.Client(timeout=5.0) as http:
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"Synapse exited with {process.returncode} while starting:\n"
                                   f"{(directory / 'stdout.log').read_text(errors='replace')[-4000:]}\n"
                                   f"{server.log_tail()}")
            try:
                if http.get(f"{base}/_matrix/client/versions").status_code == 200:
                    return server
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                process.kill()
                raise RuntimeError(f"Synapse did not answer /_matrix/client/versions in {START_TIMEOUT_S:.0f}s:\n"
                                   f"{server.log_tail()}")
            try:
                process.wait(timeout=0.1)  # the poll interval: returns early if it exits
            except subprocess.TimeoutExpired:
                pass


def stop_synapse(server: Synapse) -> None:
    assert server.process is not None
    server.process.terminate()
    try:
        server.process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        server.process.kill()
        server.process.wait(timeout=30)


def _shared_synapse() -> Synapse:
    """The run's homeserver under pytest-xdist: started by the first worker to ask, handed to a
    keeper that stops it when the run's controller exits; the others read where it is."""
    from tests.support.parallel import run_dir

    where = run_dir() / "synapse.json"
    with open(run_dir() / "synapse.lock", "a+b") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        if where.is_file():
            known = json.loads(where.read_text())
            return Synapse(known["base_url"], known["secret"], Path(known["directory"]), None)
        directory = Path(tempfile.mkdtemp(prefix="talon-test-synapse-"))
        server = start_synapse(directory)
        assert server.process is not None
        subprocess.run([sys.executable, "-m", "tests.support.keeper", str(os.getppid()),
                        str(server.process.pid), str(directory)],
                       cwd=Path(__file__).resolve().parents[2], check=True, timeout=60)
        where.write_text(json.dumps({"base_url": server.base_url, "secret": server._secret,
                                     "directory": str(directory)}))
        return server


@pytest.fixture(scope="session")
def synapse() -> Iterator[Synapse]:
    """One homeserver for the run (shared by the xdist workers, see above)."""
    from tests.support.parallel import worker

    if worker() is not None:
        yield _shared_synapse()
        return
    directory = Path(tempfile.mkdtemp(prefix="talon-test-synapse-"))
    server = start_synapse(directory)
    try:
        yield server
    finally:
        stop_synapse(server)
        shutil.rmtree(directory, ignore_errors=True)
