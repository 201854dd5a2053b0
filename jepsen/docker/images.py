"""Build the project's Docker image from a wheelhouse made on the host.

Why a host-side wheelhouse: the image build must not need the network (this project's
machines run a Docker engine with no registry, and the build containers may have no route
out), so everything pip installs inside the image is a wheel prepared here first:

* ``wheelhouse/ledgermq-*.whl``: the project itself, built from a clean copy of the source
  (so no ``build/`` directory is left in the work tree) with ``SOURCE_DATE_EPOCH`` fixed,
  which makes the wheel byte-identical for identical sources and lets Docker's layer cache
  skip the install step when nothing changed;
* ``wheelhouse/deps/``: only the servers' run-time dependencies (:data:`RUNTIME_DEPS`), as
  binary wheels for CPython 3.11 on the engine's architecture. PySpark, matplotlib and
  pysyncobj are harness/checker dependencies and stay out of the image.

The base image is ``python:3.11-slim`` where it can be used; where it is neither present
nor pullable, ``build-base-image.sh`` makes ``ledgermq-base:<codename>`` with debootstrap.
Only the standard library is used here, so ``python -m jepsen.docker build`` works before
the project is installed.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WHEELHOUSE = ROOT / "wheelhouse"
DEFAULT_IMAGE = "ledgermq:latest"
UPSTREAM_BASE = "python:3.11-slim"
RUNTIME_DEPS = (
    "xxhash>=3.4",
    "zlib-ng>=0.5",
    "uvloop>=0.19",
    "prometheus-client>=0.20",
    "click>=8.1",
    # the RocketMQ 5 gRPC proxy (compose's ``proxy`` profile)
    "grpcio>=1.66",
    "protobuf>=5.28",
)
#: Source that goes into the project wheel (everything pyproject's package finder includes).
SOURCE_ITEMS = (
    "pyproject.toml",
    "README.md",
    "common",
    "ledger",
    "namesrv",
    "broker",
    "jepsen",
    "remoting",
    "client",
    "proxy",  # with proxy/_pb, built on the host first (:func:`build_protocol`): the image has no network
)
BASE_SCRIPT = Path(__file__).resolve().with_name("build-base-image.sh")


class ImageBuildError(RuntimeError):
    """A build step failed; the message carries the command and the tail of its output."""


def _run(
    argv: list[str], *, timeout: float, env: dict[str, str] | None = None, cwd: Path | None = None
) -> str:
    """Run a build command, failing with its output so a broken build says why."""
    try:
        proc = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise ImageBuildError(f"{' '.join(argv)} took longer than {timeout:.0f}s") from exc
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr)[-4000:]
        raise ImageBuildError(f"{' '.join(argv)} exited with {proc.returncode}:\n{tail}")
    return proc.stdout


def image_exists(tag: str) -> bool:
    """True if the engine has ``tag`` locally (no registry is asked)."""
    return (
        subprocess.run(
            ["docker", "image", "inspect", tag], capture_output=True, timeout=60, check=False
        ).returncode
        == 0
    )


def default_base_tag() -> str:
    """``ledgermq-base:<codename>`` for this host's Debian release (what build-base-image.sh makes)."""
    codename = "bookworm"
    try:
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("VERSION_CODENAME=") and line.split("=", 1)[1].strip('"'):
                codename = line.split("=", 1)[1].strip('"')
    except OSError:
        pass
    return f"ledgermq-base:{codename}"


def ensure_base_image(base_image: str | None = None, *, pull_timeout: float = 60.0, log=print) -> str:
    """Return a base image tag that exists locally, making one if needed.

    Order: an explicit ``base_image`` (or ``LEDGERMQ_BASE_IMAGE``) is used as given (built
    with the debootstrap script if it is a ``ledgermq-base:*`` tag that is missing); otherwise
    ``python:3.11-slim`` if present or pullable; otherwise the local debootstrap base, built
    once per machine (about 1.5 minutes) and reused afterwards.
    """
    base_image = base_image or os.environ.get("LEDGERMQ_BASE_IMAGE") or None
    if base_image:
        if image_exists(base_image):
            return base_image
        if base_image.startswith("ledgermq-base:"):
            _build_local_base(base_image, log)
            return base_image
        _run(["docker", "pull", base_image], timeout=600)
        return base_image
    local = default_base_tag()
    if image_exists(local):
        return local
    if image_exists(UPSTREAM_BASE):
        return UPSTREAM_BASE
    try:
        _run(["docker", "pull", UPSTREAM_BASE], timeout=pull_timeout)
        return UPSTREAM_BASE
    except ImageBuildError as exc:
        log(
            f"cannot pull {UPSTREAM_BASE} ({str(exc).splitlines()[-1][:200]}); building {local} with debootstrap"
        )
    _build_local_base(local, log)
    return local


def _build_local_base(tag: str, log) -> None:
    t0 = time.monotonic()
    _run(["bash", str(BASE_SCRIPT), "--tag", tag], timeout=1800)
    log(f"base image {tag} built in {time.monotonic() - t0:.0f}s")


def _engine_arch() -> str:
    """The engine's CPU architecture in wheel-tag spelling (x86_64, aarch64)."""
    try:
        arch = _run(["docker", "info", "--format", "{{.Architecture}}"], timeout=60).strip()
    except ImageBuildError:
        arch = platform.machine()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(arch, arch or "x86_64")


def build_protocol(log=print) -> None:
    """Build the proxy's RocketMQ 5 message types into proxy/_pb on the host (a no-op when
    built), so that the project wheel carries them: inside the image nothing can download them."""
    t0 = time.monotonic()
    out = _run([sys.executable, "-m", "proxy.protocol_build"], timeout=600, cwd=ROOT)
    log(f"proxy message types: {out.strip()} ({time.monotonic() - t0:.0f}s)")


def build_wheelhouse(wheelhouse: Path = WHEELHOUSE, *, refresh_deps: bool = False, log=print) -> Path:
    """Make ``wheelhouse/`` (the project wheel + run-time dependency wheels) and return the project wheel.

    The dependency wheels are downloaded once (``refresh_deps`` downloads them again);
    the project wheel is rebuilt from a temporary copy of the source whenever that source
    differs from what the wheel was built from (a digest kept beside it, :data:`SOURCE_STAMP`):
    a test session builds images several times over the same tree, and each ``pip wheel``
    costs 10-15 s of a build-isolation venv.
    """
    deps = wheelhouse / "deps"
    deps.mkdir(parents=True, exist_ok=True)
    names = [d.split(">")[0].split("=")[0].replace("-", "_").lower() for d in RUNTIME_DEPS]
    have = {p.name.split("-")[0].lower() for p in deps.glob("*.whl")}
    if refresh_deps or not set(names) <= have:
        arch = _engine_arch()
        platforms = [f"manylinux{v}_{arch}" for v in ("2014", "_2_17", "_2_24", "_2_28", "_2_31", "_2_34")]
        argv = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--disable-pip-version-check",
            "--only-binary=:all:",
            "--python-version",
            "3.11",
            "--implementation",
            "cp",
            "--dest",
            str(deps),
        ]
        for p in platforms:
            argv += ["--platform", p]
        t0 = time.monotonic()
        _run([*argv, *RUNTIME_DEPS], timeout=900)
        log(f"run-time dependency wheels in {deps} ({time.monotonic() - t0:.0f}s)")

    build_protocol(log=log)
    digest = source_digest()
    stamp = wheelhouse / SOURCE_STAMP
    built = sorted(wheelhouse.glob("ledgermq-*.whl"))
    if len(built) == 1 and stamp.exists() and stamp.read_text().strip() == f"{digest} {built[0].name}":
        log(f"project wheel {built[0].name} unchanged (source digest {digest[:12]})")
        return built[0]
    stamp.unlink(missing_ok=True)
    for old in built:
        old.unlink()
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="ledgermq-src-") as tmp:
        src = Path(tmp) / "src"
        src.mkdir()
        ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "wheelhouse", ".*cache")
        for item in SOURCE_ITEMS:
            p = ROOT / item
            if p.is_dir():
                shutil.copytree(p, src / item, ignore=ignore)
            elif p.exists():
                shutil.copy2(p, src / item)
        env = {**os.environ, "SOURCE_DATE_EPOCH": "315532800"}
        _run(
            [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                "--disable-pip-version-check",
                "--no-deps",
                "-q",
                "-w",
                str(wheelhouse),
                str(src),
            ],
            timeout=900,
            env=env,
        )
    wheels = sorted(wheelhouse.glob("ledgermq-*.whl"))
    if len(wheels) != 1:
        raise ImageBuildError(
            f"expected one ledgermq wheel in {wheelhouse}, found {[w.name for w in wheels]}"
        )
    stamp.write_text(f"{digest} {wheels[0].name}\n")
    log(f"project wheel {wheels[0].name} ({time.monotonic() - t0:.0f}s)")
    return wheels[0]


#: beside the project wheel: the digest of the source it was built from, and its file name
SOURCE_STAMP = "ledgermq-source.sha256"
_IGNORED_PARTS = ("__pycache__", "wheelhouse")
_IGNORED_SUFFIXES = (".pyc", ".egg-info")


def source_digest(root: Path = ROOT) -> str:
    """SHA-256 over the paths and bytes of everything :data:`SOURCE_ITEMS` puts in the wheel
    (the same files the build copies: caches and build leftovers skipped)."""
    h = hashlib.sha256()
    for item in SOURCE_ITEMS:
        top = root / item
        files = (
            [top]
            if top.is_file()
            else sorted(p for p in top.rglob("*") if p.is_file())
            if top.is_dir()
            else []
        )
        for f in files:
            rel = f.relative_to(root)
            if any(part in _IGNORED_PARTS or part.endswith(_IGNORED_SUFFIXES) for part in rel.parts):
                continue
            if any(part.startswith(".") and part.endswith("cache") for part in rel.parts):
                continue
            h.update(str(rel).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def build_image(
    tag: str = DEFAULT_IMAGE,
    *,
    base_image: str | None = None,
    refresh_deps: bool = False,
    log=print,
) -> str:
    """Build ``tag`` from the top-level Dockerfile (classic builder) and return it.

    Runs :func:`ensure_base_image` and :func:`build_wheelhouse` first; unchanged layers
    come from Docker's cache, so a rebuild with no source change takes seconds.
    """
    base = ensure_base_image(base_image, log=log)
    build_wheelhouse(refresh_deps=refresh_deps, log=log)
    t0 = time.monotonic()
    previous = _image_id(tag)
    env = {**os.environ, "DOCKER_BUILDKIT": "0"}  # the classic builder must work: use it
    _run(
        [
            "docker",
            "build",
            "--build-arg",
            f"BASE_IMAGE={base}",
            "-t",
            tag,
            "-f",
            str(ROOT / "Dockerfile"),
            str(ROOT),
        ],
        timeout=1800,
        env=env,
    )
    log(f"image {tag} (FROM {base}) built in {time.monotonic() - t0:.0f}s")
    if previous and previous != _image_id(tag):
        # The image this tag named before is now untagged: remove it rather than pile up 200 MB
        # per source change (it stays if a container still uses it).
        inspect = subprocess.run(
            ["docker", "image", "inspect", "--format", "{{len .RepoTags}}", previous],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if inspect.returncode == 0 and inspect.stdout.strip() == "0":
            subprocess.run(["docker", "image", "rm", previous], capture_output=True, timeout=120, check=False)
    return tag


def _image_id(tag: str) -> str | None:
    proc = subprocess.run(
        ["docker", "image", "inspect", "--format", "{{.Id}}", tag],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return proc.stdout.strip() if proc.returncode == 0 else None


SPARK_IMAGE = "ledgermq-spark:latest"
SPARK_WHEELHOUSE = WHEELHOUSE / "spark"
SPARK_DOCKERFILE = Path(__file__).resolve().with_name("spark.Dockerfile")
#: what the Spark image's Python needs, pinned to this host's versions: a Spark Connect client
#: and server must be the same Spark release, and the checker's UDFs run on both sides
SPARK_PACKAGES = ("pyspark", "py4j", "pandas", "pyarrow", "numpy")


def _installed(package: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        raise ImageBuildError(
            f"{package} is not installed here; the Spark image copies this host's version"
        ) from None


def build_spark_wheelhouse(dest: Path = SPARK_WHEELHOUSE, *, log=print) -> Path:
    """Wheels for the Spark image, at this host's versions: pyspark (published as an sdist, so
    ``pip wheel`` makes it once; pip's wheel cache keeps it) and the binary wheels of the rest."""
    dest.mkdir(parents=True, exist_ok=True)
    pins = {p: _installed(p) for p in SPARK_PACKAGES}
    have = {w.name.split("-")[0].lower(): w.name.split("-")[1] for w in dest.glob("*.whl")}
    if all(have.get(p.replace("-", "_")) == v for p, v in pins.items()):
        return dest
    t0 = time.monotonic()
    pip = [sys.executable, "-m", "pip"]
    _run(
        [
            *pip,
            "wheel",
            "--disable-pip-version-check",
            "--no-deps",
            "-q",
            "-w",
            str(dest),
            f"pyspark=={pins['pyspark']}",
        ],
        timeout=1800,
    )
    arch = _engine_arch()
    argv = [
        *pip,
        "download",
        "--disable-pip-version-check",
        "--only-binary=:all:",
        "--python-version",
        "3.11",
    ]
    argv += ["--implementation", "cp", "--dest", str(dest)]
    for v in ("2014", "_2_17", "_2_24", "_2_27", "_2_28"):
        argv += ["--platform", f"manylinux{v}_{arch}"]
    _run([*argv, *(f"{p}=={v}" for p, v in pins.items() if p != "pyspark")], timeout=900)
    log(f"Spark wheels in {dest} ({time.monotonic() - t0:.0f}s)")
    return dest


def build_spark_image(tag: str = SPARK_IMAGE, *, base_image: str | None = None, log=print) -> str:
    """Build ``tag`` (a JRE + pyspark, pandas, pyarrow + the project) from jepsen/docker/spark.Dockerfile.

    On the same base image as the project image (:func:`ensure_base_image`), with
    ``wheelhouse/`` as the context: the JRE and Spark layers come from Docker's cache after
    the first build (about 1.5 minutes), so a source change rebuilds only the project layer.
    """
    base = ensure_base_image(base_image, log=log)
    build_spark_wheelhouse(log=log)
    build_wheelhouse(log=log)
    t0 = time.monotonic()
    env = {**os.environ, "DOCKER_BUILDKIT": "0"}
    argv = ["docker", "build", "--build-arg", f"BASE_IMAGE={base}", "-t", tag]
    _run([*argv, "-f", str(SPARK_DOCKERFILE), str(WHEELHOUSE)], timeout=1800, env=env)
    log(f"image {tag} (FROM {base}) built in {time.monotonic() - t0:.0f}s")
    return tag
