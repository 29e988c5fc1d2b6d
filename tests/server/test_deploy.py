"""Deployment files, checked without a Docker engine: docker-compose.yml parses and names an existing
Dockerfile and the shipped checkpoint, its MUSICREL_* variables are real settings with valid values, health
checks hit /readyz, the stop grace outlasts the drain, and the GPU profile reserves an NVIDIA device."""

from __future__ import annotations

import fnmatch
import re
import shlex
from pathlib import Path

import pytest
import yaml

from server.cli import GRACEFUL_SHUTDOWN_S
from server.settings import Settings

REPO = Path(__file__).resolve().parents[2]
COMPOSE = REPO / "docker-compose.yml"
CONTAINER_CHECKPOINT = "/app/checkpoints/default"


@pytest.fixture(scope="module")
def compose() -> dict:
    data = yaml.safe_load(COMPOSE.read_text())  # also resolves the x-limits merge keys
    assert isinstance(data, dict) and data.get("services"), "docker-compose.yml has no services"
    return data


@pytest.fixture(scope="module")
def services(compose) -> dict[str, dict]:
    return compose["services"]


@pytest.fixture(scope="module")
def dockerfile() -> str:
    return (REPO / "Dockerfile").read_text()


def _instructions(dockerfile: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    joined = re.sub(r"\\\n", " ", dockerfile)
    out = []
    for line in joined.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def _seconds(duration: str) -> float:
    """Compose durations: '45s', '1m30s', '1500ms'."""
    units = {"h": 3600, "m": 60, "s": 1, "ms": 0.001, "us": 1e-6}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|us|h|m|s)", str(duration))
    assert parts and "".join(n + u for n, u in parts) == str(duration), f"bad duration {duration!r}"
    return sum(float(n) * units[u] for n, u in parts)


def _dockerignored(path: str) -> bool:
    ignored = False
    for raw in (REPO / ".dockerignore").read_text().splitlines():
        pattern = raw.strip()
        if not pattern or pattern.startswith("#"):
            continue
        negate = pattern.startswith("!")
        pattern = pattern.lstrip("!").rstrip("/")
        parts = path.split("/")
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]  # a matched folder hides its files
        patterns = (pattern, pattern.removeprefix("**/"))
        if any(fnmatch.fnmatch(p, pat) for p in prefixes for pat in patterns):
            ignored = not negate
    return ignored


def test_every_service_builds_from_an_existing_dockerfile(services):
    for name, service in services.items():
        build = service["build"]
        context = REPO / build.get("context", ".")
        assert context.resolve() == REPO, f"{name}: build context must be the repo root"
        assert (context / build.get("dockerfile", "Dockerfile")).is_file(), name


def test_default_service_has_no_profile_and_gpu_service_is_in_the_gpu_profile(services):
    default = [n for n, s in services.items() if not s.get("profiles")]
    gpu = [n for n, s in services.items() if "gpu" in s.get("profiles", [])]
    assert len(default) == 1 and len(gpu) == 1
    service = services[gpu[0]]
    assert service["build"]["args"]["BASE_IMAGE"].startswith("nvidia/cuda:")
    assert "/whl/cu" in service["build"]["args"]["TORCH_INDEX_URL"]
    assert service["environment"]["MUSICREL_DEVICE"].startswith("cuda")
    devices = service["deploy"]["resources"]["reservations"]["devices"]
    assert any(d["driver"] == "nvidia" and "gpu" in d["capabilities"] for d in devices)


def test_the_shipped_checkpoint_is_mounted_and_exists_in_the_repo(services):
    for name, service in services.items():
        mounts = [v.split(":") for v in service.get("volumes", [])]
        sources = [m[0] for m in mounts if m[1] == CONTAINER_CHECKPOINT]
        assert sources == ["./checkpoints/default"], f"{name}: mount the shipped checkpoint"
        folder = REPO / sources[0]
        for required in ("config.json", "model.safetensors"):
            assert (folder / required).is_file(), f"{folder / required} missing: no shipped model in the repo"
        command = service["command"]
        assert command[:2] == ["musicrel", "serve"]
        assert command[command.index("--checkpoint") + 1] == CONTAINER_CHECKPOINT


def test_every_musicrel_variable_is_a_real_setting_with_a_valid_value(services, monkeypatch):
    fields = set(Settings.model_fields)
    for name, service in services.items():
        env = service["environment"]
        assert isinstance(env, dict), f"{name}: environment as a mapping"
        ours = {k: v for k, v in env.items() if k.startswith("MUSICREL_")}
        assert {
            "MUSICREL_MAX_UPLOAD_BYTES",
            "MUSICREL_MAX_QUEUE",
            "MUSICREL_BATCH_WINDOW_MS",
            "MUSICREL_REQUEST_TIMEOUT_S",
            "MUSICREL_DRAIN_TIMEOUT_S",
        } <= set(ours), name
        unknown = [k for k in ours if k.removeprefix("MUSICREL_").lower() not in fields]
        assert unknown == [], f"{name}: not fields of server.settings.Settings: {unknown}"
        for key in list(Settings.model_fields):
            monkeypatch.delenv(f"MUSICREL_{key.upper()}", raising=False)
        for key, value in ours.items():
            monkeypatch.setenv(key, str(value))
        settings = Settings()  # raises on an invalid value
        for key, value in ours.items():
            parsed = getattr(settings, key.removeprefix("MUSICREL_").lower())
            if isinstance(parsed, int | float) and not isinstance(parsed, bool):
                assert parsed == pytest.approx(float(value)), key


def test_stop_grace_period_outlasts_the_drain(services):
    for name, service in services.items():
        drain = float(service["environment"]["MUSICREL_DRAIN_TIMEOUT_S"])
        assert service.get("stop_signal", "SIGTERM") == "SIGTERM"
        assert _seconds(service["stop_grace_period"]) > drain + GRACEFUL_SHUTDOWN_S, name


def test_healthchecks_target_readyz(services, dockerfile):
    for name, service in services.items():
        test = service["healthcheck"]["test"]
        command = " ".join(test) if isinstance(test, list) else test
        assert re.search(r"127\.0\.0\.1:8000/readyz\b", command), f"{name}: {command}"
        assert service["ports"] and all(str(p).endswith(":8000") for p in service["ports"]), name
    healthchecks = [args for word, args in _instructions(dockerfile) if word == "HEALTHCHECK"]
    assert len(healthchecks) == 1 and "127.0.0.1:8000/readyz" in healthchecks[0]


def test_dockerfile_cpu_default_cuda_arg_pinned_torch_non_root(dockerfile):
    instructions = _instructions(dockerfile)
    args = dict(a.split("=", 1) for w, a in instructions if w == "ARG" and "=" in a)
    assert args["BASE_IMAGE"] == "python:3.11-slim"
    assert [a for w, a in instructions if w == "FROM"] == ["${BASE_IMAGE}"]
    assert args["TORCH_INDEX_URL"].endswith("/whl/cpu")
    makefile_spec = re.search(r"^TORCH_SPEC \?= (\S+)", (REPO / "Makefile").read_text(), re.M).group(1)
    assert args["TORCH_SPEC"] == makefile_spec, "keep the image's torch pin in step with the Makefile"
    torch_run = [a for w, a in instructions if w == "RUN" and "TORCH_SPEC" in a]
    assert torch_run and "--index-url" in torch_run[0]
    users = [a for w, a in instructions if w == "USER"]
    assert users and users[-1] not in ("root", "0")
    assert [a for w, a in instructions if w == "EXPOSE"] == ["8000"]
    cmd = [a for w, a in instructions if w == "CMD"][-1]
    assert shlex.split(cmd.strip("[]").replace(",", " ")) == [
        "musicrel",
        "serve",
        "--checkpoint",
        CONTAINER_CHECKPOINT,
        "--host",
        "0.0.0.0",
        "--port",
        "8000",
    ]


def test_dockerfile_copies_only_existing_and_unignored_paths(dockerfile):
    copies = [a.split() for w, a in _instructions(dockerfile) if w == "COPY"]
    sources = [
        s
        for c in copies
        if not any(x.startswith("--from") for x in c)
        for s in c[:-1]
        if not s.startswith("--")
    ]
    assert "checkpoints/default" in sources
    for source in sources:
        assert (REPO / source).exists(), f"COPY {source}: not in the repo"
        assert not _dockerignored(source), f"COPY {source}: excluded by .dockerignore"
    for heavy in (".venv", ".git", "data", "runs", "checkpoints/other"):
        assert _dockerignored(heavy), f"{heavy} would be sent to the Docker daemon"


def test_compose_commands_parse_with_the_real_cli(services):
    """The command each service runs is accepted by `musicrel serve` (compose's ${VAR:-default} resolved)."""
    from musicrel.cli import build_parser

    for name, service in services.items():
        argv = [re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", a) for a in service["command"]]
        assert argv[0] == "musicrel", name
        args = build_parser().parse_args(argv[1:])
        assert (str(args.checkpoint), args.host, args.port) == (CONTAINER_CHECKPOINT, "0.0.0.0", 8000), name
        assert args.workers >= 1
