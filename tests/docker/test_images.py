"""The node image: built from local files, its roles run (ZooKeeper's jars, bkref)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from bkref.nemesis import docker_images
from bkref.nemesis.docker_engine import DockerEngine, missing_packages
from bkref.nemesis.docker_images import IMAGE, base_key, build, debian_mirror


def test_debian_mirror_is_apts_main_archive(tmp_path: Path) -> None:
    sources = tmp_path / "debian.sources"
    sources.write_text(
        "Types: deb\nURIs: http://mirror.example/debian\nSuites: bookworm\n\n"
        "Types: deb\nURIs: http://mirror.example/debian-security\n"
    )
    assert debian_mirror(sources) == "http://mirror.example/debian"
    assert debian_mirror(tmp_path / "absent") == docker_images.DEFAULT_MIRROR


def test_base_key_follows_the_package_list(monkeypatch: pytest.MonkeyPatch) -> None:
    key = base_key()
    monkeypatch.setattr(docker_images, "BASE_PACKAGES", (*docker_images.BASE_PACKAGES, "vim"))
    assert base_key() != key


CAN_START = os.geteuid() == 0 and not missing_packages()


@pytest.fixture(scope="module")
def engine(engine_dir: Path) -> Iterator[DockerEngine]:
    engine = DockerEngine(engine_dir)  # tests/docker/conftest.py: the session's images
    engine.start()
    try:
        yield engine
    finally:
        engine.stop()


@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.timeout(900)  # a cold build runs debootstrap against the Debian mirror
@pytest.mark.skipif(not CAN_START, reason="the private Docker engine needs root and docker.io")
def test_node_image_builds_and_its_roles_run(engine: DockerEngine) -> None:
    docker = engine.client()
    times = build(docker)
    assert "docker build" in times.steps
    out = docker.run(IMAGE, ["client", "--help"], remove=True)
    assert isinstance(out, str)
    assert "usage: bkref" in out
    jars = docker.run(
        IMAGE,
        ["-c", "ls /usr/share/java/zookeeper.jar && java -version 2>&1"],
        entrypoint="sh",
        remove=True,
    )
    assert isinstance(jars, str)
    assert "zookeeper.jar" in jars
    assert "openjdk" in jars
