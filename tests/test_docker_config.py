"""The container set-up: non-root image, services restarted on failure, Redis behind a password."""

from __future__ import annotations

import re

import yaml

from tests.service import ROOT


def test_image_runs_as_a_non_root_user():
    text = (ROOT / "Dockerfile").read_text()
    users = re.findall(r"^USER\s+(\S+)", text, flags=re.M)
    assert users and users[-1].split(":")[0] not in ("root", "0")
    assert text.index("USER") > text.index("pip install .")  # installed as root, run as the user


def test_compose_restarts_services_and_requires_a_redis_password():
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    assert {"redis", "api", "worker-explain", "worker-train"} <= set(services)
    for name, service in services.items():
        assert service.get("restart") in ("on-failure", "unless-stopped", "always"), name
    redis_cmd = " ".join(services["redis"]["command"])
    assert "--requirepass" in redis_cmd and "$$REDIS_PASSWORD" in redis_cmd
    assert "${REDIS_PASSWORD" in services["redis"]["environment"]["REDIS_PASSWORD"]
    for name in ("api", "worker-explain", "worker-train"):
        url = services[name]["environment"]["REDIS_URL"]
        assert url.startswith("redis://:${REDIS_PASSWORD") and url.endswith("@redis:6379/0"), (name, url)


def test_compose_checks_every_worker_and_reserves_a_gpu_for_the_gpu_profile():
    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    for name in ("worker-explain", "worker-train", "worker-train-gpu"):
        check = services[name]["healthcheck"]
        assert check["test"][0] == "CMD" and "rq:workers" in check["test"][-1], name
        compile(check["test"][-1], name, "exec")  # the check is Python that parses
    gpu = services["worker-train-gpu"]
    assert gpu["profiles"] == ["gpu"] and gpu["build"]["args"]["FLAVOR"] == "cuda"
    (device,) = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]
    assert "--threads" in gpu["command"] and gpu["command"][gpu["command"].index("--queues") + 1] == "train"
