"""The deploy files agree with the code: every command exists in the `grounded` CLI (options too),
every GROUNDED_* name is a Settings field, ports line up, KEDA watches the list the Celery app
really fills, and workers get longer to stop than a job may run. No Docker engine here: the files
are parsed, not run."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
import typer.main
import yaml

from tests.conftest import REPO
from worker.app import app as celery_app
from worker.cli import cli as cli_app
from worker.settings import Settings
from worker.store.keys import QUEUE, queue_lanes

DEPLOY = REPO / "deploy"
K8S = DEPLOY / "k8s"
COMPOSE = DEPLOY / "docker-compose.yml"
API_PORT, FLOWER_PORT = 8000, 5555
OTHER_ENV = {"FLOWER_BASIC_AUTH", "VLLM_API_KEY", "OPENAI_API_KEY"}  # read by Flower / by model endpoints


# --- helpers -------------------------------------------------------------------------------------


@cache
def cli() -> Any:
    """The click group typer builds: its `.commands` are what `grounded` accepts."""
    return typer.main.get_command(cli_app)


def setting_names() -> set[str]:
    return {f"GROUNDED_{name.upper()}" for name in Settings.model_fields}


def settings_from(env: dict[str, str]) -> Settings:
    """What a process with these variables would read (values are validated as the env would be)."""
    fields = {name.removeprefix("GROUNDED_").lower(): value for name, value in env.items() if name.startswith("GROUNDED_")}
    return Settings(**fields)  # type: ignore[arg-type]


def check_env_names(names: set[str]) -> None:
    unknown = {n for n in names if n.startswith("GROUNDED_")} - setting_names()
    assert not unknown, f"not Settings fields: {sorted(unknown)}"
    assert {n for n in names if not n.startswith("GROUNDED_")} <= OTHER_ENV


def option_value(argv: list[str], option: str) -> str | None:
    for i, arg in enumerate(argv):
        if arg == option and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(option + "="):
            return arg.split("=", 1)[1]
    return None


def unwrap_shell(argv: list[str]) -> list[str]:
    """`sh -c "exec ..."` (used where a variable must be checked before the program starts)."""
    if argv[:2] == ["sh", "-c"] and len(argv) == 3:
        return shlex.split(argv[2].removeprefix("exec "))
    return argv


def check_command(argv: list[str]) -> str:
    """A `grounded ...` command line (Flower too: `grounded flower` sets its task columns and refuses
    to start without auth, which `celery ... flower` would not); returns which role it is."""
    argv = unwrap_shell(argv)
    assert argv[0] == "grounded", f"deploy files run the `grounded` command, not {argv[0]!r}"
    command = cli().commands.get(argv[1])
    assert command is not None, f"`grounded {argv[1]}` is not a command; have {sorted(cli().commands)}"
    known = {opt for param in command.params for opt in param.opts}
    used = {arg.split("=", 1)[0] for arg in argv[2:] if arg.startswith("-")}
    assert used <= known, f"`grounded {argv[1]}` has no option {sorted(used - known)}"
    return argv[1]


def port_of(argv: list[str]) -> int:
    text = option_value(unwrap_shell(argv), "--port") or ""
    match = re.fullmatch(r"(\d+)|\$\{\w+:-(\d+)\}", text)
    assert match, f"no port in {argv}"
    return int(match.group(1) or match.group(2))


# --- Procfile ------------------------------------------------------------------------------------


def procfile() -> dict[str, str]:
    entries = {}
    for line in (REPO / "Procfile").read_text().splitlines():
        if line.strip():
            match = re.fullmatch(r"([A-Za-z0-9_-]+):\s*(.+)", line)
            assert match, f"not a Procfile line: {line!r}"
            entries[match.group(1)] = match.group(2)
    return entries


def test_procfile_has_web_worker_and_flower_running_real_commands() -> None:
    entries = procfile()
    assert set(entries) == {"web", "worker", "flower"}
    roles = {name: check_command(shlex.split(command)) for name, command in entries.items()}
    assert roles == {"web": "api", "worker": "worker", "flower": "flower"}
    assert port_of(shlex.split(entries["web"])) == API_PORT
    assert port_of(shlex.split(entries["flower"])) == FLOWER_PORT
    assert shlex.split(entries["worker"]) == ["grounded", "worker"], "workers run with the project's defaults"


def test_procfile_flower_is_grounded_flower_with_no_password_on_its_command_line() -> None:
    """Flower reads FLOWER_BASIC_AUTH from the environment (.env for honcho); a password passed as
    `--basic-auth` would show in every process listing."""
    flower = shlex.split(procfile()["flower"])
    assert flower[:2] == ["grounded", "flower"] and option_value(flower, "--basic-auth") is None


def test_grounded_flower_refuses_to_start_without_basic_auth(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "FLOWER_BASIC_AUTH" and not k.startswith("GROUNDED_")}
    refused = subprocess.run([sys.executable, "-m", "worker.cli", "flower", "--port", "1"], cwd=REPO, env=env,
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "FLOWER_BASIC_AUTH is not set" in refused.stderr


# --- Dockerfile ----------------------------------------------------------------------------------


def dockerfile() -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", (DEPLOY / "Dockerfile").read_text())
    instructions = []
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            keyword, _, rest = line.strip().partition(" ")
            instructions.append((keyword.upper(), rest.strip()))
    return instructions


def test_dockerfile_one_non_root_image_installed_from_pyproject() -> None:
    steps = dockerfile()
    stages = [rest for keyword, rest in steps if keyword == "FROM"]
    assert stages[0] == "python:3.11-slim AS app"
    assert stages[-1] == "app AS runtime", "the default target mounts corpora; `baked` is opt-in"
    copied = " ".join(rest for keyword, rest in steps if keyword == "COPY")
    for needed in ("pyproject.toml", "README.md", "capabilities", "worker"):
        assert needed in copied
    [install] = [rest for keyword, rest in steps if keyword == "RUN" and "pip install ." in rest]
    assert "rm -rf capabilities worker" in install, "no source tree beside the installed package (python -m)"
    users = [rest for keyword, rest in steps if keyword == "USER"]
    assert users and all(user.split(":")[0] not in {"root", "0"} for user in users)
    exposed = {int(p) for keyword, rest in steps if keyword == "EXPOSE" for p in rest.split()}
    assert exposed == {API_PORT, FLOWER_PORT}
    cmd = next(rest for keyword, rest in steps if keyword == "CMD")
    assert check_command(yaml.safe_load(cmd)) == "worker"
    env = " ".join(rest for keyword, rest in steps if keyword == "ENV")
    assert "GROUNDED_DATA_DIR=/data" in env
    assert not any(keyword == "VOLUME" for keyword, _ in steps)


def test_dockerfile_baked_corpora_land_where_settings_look() -> None:
    baked = " ".join(rest for keyword, rest in dockerfile() if keyword == "RUN" and "grounded ingest" in rest)
    assert check_command(["grounded", "ingest", "/tmp/corpus-src", "--corpus", "x"]) == "ingest"
    corpora = Settings(data_dir=Path("/data")).corpora_dir  # type: ignore[call-arg]
    assert "--corpus \"${CORPUS}\"" in baked and corpora == Path("/data/corpora")


# --- docker compose ------------------------------------------------------------------------------


@cache
def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


def compose_env(service: str) -> dict[str, str]:
    return {k: str(v) for k, v in (compose()["services"][service].get("environment") or {}).items()}


def test_compose_services_run_real_commands_with_known_settings() -> None:
    services = compose()["services"]
    assert {"redis", "api", "worker", "flower"} <= set(services)
    roles = {name: check_command(s["command"]) for name, s in services.items() if name != "redis"}
    assert roles == {"api": "api", "worker": "worker", "flower": "flower", "ingest": "ingest"}
    for name in roles:
        check_env_names(set(compose_env(name)))
        redis_url = urlparse(compose_env(name)["GROUNDED_REDIS_URL"])
        assert (redis_url.hostname, redis_url.port or 6379) == ("redis", 6379)
        assert compose_env(name)["GROUNDED_DATA_DIR"] == "/data"
    assert "GROUNDED_TAG_KEYS" in compose_env("worker") and "GROUNDED_API_TOKENS" in compose_env("api")
    assert compose_env("flower")["FLOWER_BASIC_AUTH"].startswith("${FLOWER_BASIC_AUTH:?"), "compose refuses without it"


def test_compose_ports_match_the_commands() -> None:
    services = compose()["services"]
    assert services["api"]["ports"] == [f"{API_PORT}:{port_of(services['api']['command'])}"]
    assert port_of(services["api"]["command"]) == API_PORT
    [flower_port] = services["flower"]["ports"]
    assert flower_port.startswith("127.0.0.1:") and flower_port.endswith(f":{port_of(services['flower']['command'])}")


def test_H15_compose_workers_scale_and_stop_after_their_soft_shutdown_window() -> None:
    worker = compose()["services"]["worker"]
    assert "container_name" not in worker and "ports" not in worker, "`--scale worker=N` needs neither"
    grace = int(re.fullmatch(r"(\d+)s", worker["stop_grace_period"]).group(1))  # type: ignore[union-attr]
    settings = settings_from(compose_env("worker"))
    assert settings.soft_shutdown_s + 15 <= grace < settings.task_hard_limit_s


def test_compose_redis_appends_to_a_volume_and_never_evicts() -> None:
    redis = compose()["services"]["redis"]
    command = redis["command"]
    assert option_value(command, "--appendonly") == "yes"
    assert option_value(command, "--maxmemory-policy") == "noeviction"
    volume, _, path = redis["volumes"][0].partition(":")
    assert volume in compose()["volumes"] and path == "/data"


def test_D5_compose_serves_corpora_from_a_read_only_mount_and_only_ingest_writes() -> None:
    mounts = {name: [v for v in service.get("volumes", []) if ":/data/corpora" in v]
              for name, service in compose()["services"].items()}
    assert mounts["worker"] == ["corpora:/data/corpora:ro"] and mounts["api"] == ["corpora:/data/corpora:ro"]
    assert mounts["ingest"] == ["corpora:/data/corpora"]


def test_compose_model_server_is_offered_commented_with_the_env_jobs_need() -> None:
    text = COMPOSE.read_text()
    assert re.search(r"^  # vllm:$", text, re.MULTILINE) and "vllm" not in compose()["services"]
    assert "base_url: http://vllm:8000/v1" in text and "api_key_env: VLLM_API_KEY" in text
    assert "VLLM_API_KEY" in compose_env("worker")


# --- Kubernetes ----------------------------------------------------------------------------------


@cache
def manifests() -> list[dict[str, Any]]:
    docs = []
    for path in sorted(K8S.glob("*.yaml")):
        docs += [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
    return docs


def find(kind: str, name: str) -> dict[str, Any]:
    [doc] = [d for d in manifests() if d["kind"] == kind and d.get("metadata", {}).get("name") == name]
    return doc


def config_map() -> dict[str, str]:
    return find("ConfigMap", "grounded-config")["data"]


def container(deployment: str) -> dict[str, Any]:
    [main] = find("Deployment", deployment)["spec"]["template"]["spec"]["containers"]
    return main


def test_k8s_has_every_part() -> None:
    kinds = {(d["kind"], d.get("metadata", {}).get("name")) for d in manifests()}
    assert {
        ("Deployment", "grounded-api"), ("Service", "grounded-api"),
        ("Deployment", "grounded-worker"), ("PodDisruptionBudget", "grounded-worker"),
        ("ScaledObject", "grounded-worker"), ("Deployment", "grounded-flower"), ("Service", "grounded-flower"),
        ("StatefulSet", "grounded-redis"), ("Service", "grounded-redis"), ("Secret", "grounded-secrets"),
        ("ConfigMap", "grounded-config"),
    } <= kinds
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    listed = set(kustomization["resources"])
    assert all((K8S / name).is_file() for name in listed)
    assert "secret.example.yaml" not in listed, "the template must be filled in, not applied"
    assert "Managed Redis instead" in (K8S / "redis.yaml").read_text()


def test_k8s_env_names_are_settings_and_secrets_come_from_the_template() -> None:
    secret = find("Secret", "grounded-secrets")["stringData"]
    check_env_names(set(config_map()) | set(secret))
    assert {"GROUNDED_TAG_KEYS", "GROUNDED_API_TOKENS"} <= set(secret)
    settings_from(config_map())  # the values parse as the processes will parse them
    for deployment in ("grounded-api", "grounded-worker", "grounded-flower"):
        spec = container(deployment)
        assert [ref["configMapRef"]["name"] for ref in spec["envFrom"]] == ["grounded-config"]
        for var in spec.get("env", []):
            ref = var["valueFrom"]["secretKeyRef"]
            assert ref["name"] == "grounded-secrets" and ref["key"] in secret and ref["key"] == var["name"]
        check_env_names({var["name"] for var in spec.get("env", [])})
    names = {var["name"] for var in container("grounded-worker")["env"]}
    assert "GROUNDED_TAG_KEYS" in names and "GROUNDED_API_TOKENS" not in names
    assert {var["name"] for var in container("grounded-api")["env"]} == {"GROUNDED_API_TOKENS"}
    assert {var["name"] for var in container("grounded-flower")["env"]} == {"FLOWER_BASIC_AUTH"}


def test_k8s_commands_and_ports_line_up_with_services() -> None:
    roles = {d: check_command(container(d)["command"]) for d in ("grounded-api", "grounded-worker", "grounded-flower")}
    assert roles == {"grounded-api": "api", "grounded-worker": "worker", "grounded-flower": "flower"}
    for deployment, port in (("grounded-api", API_PORT), ("grounded-flower", FLOWER_PORT)):
        spec = container(deployment)
        assert port_of(spec["command"]) == port
        [declared] = spec["ports"]
        assert declared["containerPort"] == port
        [service_port] = find("Service", deployment)["spec"]["ports"]
        assert service_port["targetPort"] == declared["name"]
        for probe in ("readinessProbe", "livenessProbe"):
            assert spec[probe]["httpGet"]["port"] == declared["name"]
    assert container("grounded-api")["readinessProbe"]["httpGet"]["path"] == "/healthz"
    assert container("grounded-flower")["readinessProbe"]["httpGet"]["path"] == "/healthcheck"


def test_k8s_selectors_match_their_pods() -> None:
    for doc in manifests():
        if doc["kind"] in {"Service", "PodDisruptionBudget", "Deployment", "StatefulSet"}:
            selector = doc["spec"]["selector"]
            selector = selector.get("matchLabels", selector)
            targets = [d for d in manifests() if d["kind"] in {"Deployment", "StatefulSet"}
                       and selector.items() <= d["spec"]["template"]["metadata"]["labels"].items()]
            assert len(targets) == 1, doc["metadata"]["name"]


def test_H15_k8s_worker_grace_period_covers_the_soft_shutdown_window_not_the_longest_job() -> None:
    pod = find("Deployment", "grounded-worker")["spec"]["template"]["spec"]
    settings = settings_from(config_map())
    assert settings.soft_shutdown_s + 15 <= pod["terminationGracePeriodSeconds"] < settings.task_hard_limit_s
    assert find("PodDisruptionBudget", "grounded-worker")["spec"]["maxUnavailable"] == 1


def test_k8s_workers_prefetch_one_so_the_queue_keda_reads_is_honest() -> None:
    assert celery_app.conf.worker_prefetch_multiplier == 1 and celery_app.conf.task_acks_late
    assert container("grounded-worker")["command"] == ["grounded", "worker"], "the app's settings, not overrides"


def test_keda_scales_the_worker_on_the_celery_queue_list() -> None:
    scaled = find("ScaledObject", "grounded-worker")
    assert scaled["apiVersion"] == "keda.sh/v1alpha1"
    assert scaled["spec"]["scaleTargetRef"]["name"] == "grounded-worker"
    triggers = scaled["spec"]["triggers"]
    settings = settings_from(config_map())
    assert celery_app.conf.task_default_queue == QUEUE
    lanes = [settings.key_prefix + lane for lane in queue_lanes(QUEUE)]
    assert [t["metadata"]["listName"] for t in triggers] == lanes[::-1], "both lanes (H19), new jobs' first"
    redis_url = urlparse(settings.redis_url)
    for trigger in triggers:
        assert trigger["type"] == "redis"
        assert trigger["metadata"]["address"] == f"{redis_url.hostname}:{redis_url.port or 6379}"
        assert trigger["metadata"]["databaseIndex"] == (redis_url.path.strip("/") or "0")
        assert int(trigger["metadata"]["listLength"]) == settings.concurrency
    [redis_port] = find("Service", redis_url.hostname or "")["spec"]["ports"]
    assert redis_port["port"] == (redis_url.port or 6379)


def test_k8s_redis_appends_to_a_persistent_volume_and_never_evicts() -> None:
    redis = find("StatefulSet", "grounded-redis")["spec"]
    [server] = redis["template"]["spec"]["containers"]
    assert option_value(server["args"], "--appendonly") == "yes"
    assert option_value(server["args"], "--maxmemory-policy") == "noeviction"
    [claim] = redis["volumeClaimTemplates"]
    assert server["volumeMounts"] == [{"name": claim["metadata"]["name"], "mountPath": "/data"}]


def test_k8s_pods_run_as_the_image_user() -> None:
    for deployment in ("grounded-api", "grounded-worker", "grounded-flower"):
        pod = find("Deployment", deployment)["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] == 10001


@pytest.mark.parametrize("path", sorted(p.name for p in K8S.glob("*.yaml")))
def test_every_k8s_file_parses_into_named_objects(path: str) -> None:
    docs = [d for d in yaml.safe_load_all((K8S / path).read_text()) if d]
    assert docs and all(d.get("apiVersion") and d.get("kind") for d in docs)
    assert all(d["metadata"].get("name") for d in docs if d["kind"] != "Kustomization")


def test_operations_doc_names_only_real_settings_and_commands() -> None:
    text = (REPO / "docs" / "operations.md").read_text()
    names = set(re.findall(r"GROUNDED_[A-Z_]+[A-Z]", text)) - {"GROUNDED_"}
    assert names and names <= setting_names(), sorted(names - setting_names())
    commands = set(re.findall(r"`grounded (\w+)", text))
    assert commands and commands <= set(cli().commands), sorted(commands - set(cli().commands))
    for section in ("## Scale", "## Upgrade and drain workers", "## Rotate tag keys", "## Rotate API tokens",
                    "## Back up Redis", "## Dashboards"):
        assert section in text


def test_D5_k8s_workers_mount_the_corpora_volume_read_only() -> None:
    pod = find("Deployment", "grounded-worker")["spec"]["template"]["spec"]
    [mount] = [m for m in container("grounded-worker")["volumeMounts"] if m["mountPath"] == "/data/corpora"]
    assert mount["readOnly"] is True
    [volume] = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert volume["persistentVolumeClaim"] == {"claimName": "grounded-corpora", "readOnly": True}
    assert "initContainers" not in pod, "no copy: the volume is read as it is"
