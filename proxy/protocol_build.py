"""Build step: RocketMQ 5's gRPC message types (``apache.rocketmq.v2``) as importable modules.

The types are Apache's: the generated ``definition_pb2``/``service_pb2`` (and the service's
``_grpc`` stubs) shipped in the wheel of Apache's Python client ``rocketmq-python-client``.
That wheel installs as the package ``rocketmq``, the name the 4.x C++ client the tests drive
already has, so it cannot be installed beside it. Instead this step downloads the wheel with
pip (no install, no dependencies), checks its SHA-256, and writes only the generated modules
under ``proxy/_pb/`` (git-ignored) with their imports renamed to ``proxy._pb``. Nothing
fetched is committed; ``.ci/run`` runs this before the tests, and the proxy runs it on its
first start.

    python -m proxy.protocol_build            # idempotent: does nothing when already built
    python -m proxy.protocol_build --force
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

WHEEL_REQUIREMENT = "rocketmq-python-client==5.1.2"
WHEEL_SHA256 = "b527020694cb6a91bb490b158a63c0b34e4b46b790dde2d435e4c5ba54a621f6"
#: the generated modules taken from the wheel (its ``rocketmq/grpc_protocol/`` folder)
MODULES = ("definition_pb2.py", "service_pb2.py", "service_pb2_grpc.py")
WHEEL_PACKAGE = "rocketmq/grpc_protocol/"
OUT_DIR = Path(__file__).resolve().parent / "_pb"
PIP_TIMEOUT_S = 300
#: the generated modules' own import of their package, and what it becomes here
FOREIGN_IMPORT = "from rocketmq.grpc_protocol import "
LOCAL_IMPORT = "from proxy._pb import "
MARKER = "BUILT_FROM"


class ProtocolBuildError(RuntimeError):
    """The message types could not be built; the text says why and what to do."""


def built(out_dir: Path = OUT_DIR) -> bool:
    """Whether the modules are there, from the pinned wheel."""
    marker = out_dir / MARKER
    return (
        marker.is_file()
        and marker.read_text().strip() == WHEEL_SHA256
        and all((out_dir / m).is_file() for m in MODULES)
    )


def _download(dest: Path) -> Path:
    """The pinned wheel, downloaded by pip into ``dest``."""
    argv = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "-q",
        "-d",
        str(dest),
        WHEEL_REQUIREMENT,
    ]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise ProtocolBuildError(f"pip download {WHEEL_REQUIREMENT} took over {PIP_TIMEOUT_S} s") from None
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise ProtocolBuildError(
            f"pip could not download {WHEEL_REQUIREMENT} (is PyPI reachable?): {' | '.join(tail)}"
        )
    wheels = sorted(dest.glob("*.whl"))
    if len(wheels) != 1:
        raise ProtocolBuildError(f"pip download left {len(wheels)} wheels in {dest}, expected one")
    return wheels[0]


def extract(wheel: Path, out_dir: Path = OUT_DIR) -> None:
    """Check the wheel's digest and write its generated modules, imports renamed, to ``out_dir``."""
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    if digest != WHEEL_SHA256:
        raise ProtocolBuildError(f"{wheel.name} has SHA-256 {digest}, not the pinned {WHEEL_SHA256}")
    out_dir.mkdir(parents=True, exist_ok=True)
    files = {"__init__.py": f'"""Generated: RocketMQ 5 message types from {WHEEL_REQUIREMENT}."""\n'}
    with zipfile.ZipFile(wheel) as zf:
        for name in MODULES:
            try:
                text = zf.read(WHEEL_PACKAGE + name).decode("utf-8")
            except KeyError:
                raise ProtocolBuildError(f"{wheel.name} has no {WHEEL_PACKAGE}{name}") from None
            files[name] = text.replace(FOREIGN_IMPORT, LOCAL_IMPORT)
    files[MARKER] = WHEEL_SHA256 + "\n"  # last: what built() trusts
    for name, text in files.items():
        # each file whole or not at all: two proxies starting at once may both build
        tmp = out_dir / f".{name}.{os.getpid()}.tmp"
        tmp.write_text(text)
        os.replace(tmp, out_dir / name)


def build(force: bool = False, out_dir: Path = OUT_DIR) -> bool:
    """Build the modules unless they are there already; True when it built them."""
    if built(out_dir) and not force:
        return False
    with tempfile.TemporaryDirectory(prefix="ledgermq-pb-") as tmp:
        extract(_download(Path(tmp)), out_dir)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m proxy.protocol_build", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--force", action="store_true", help="download and write them again")
    args = parser.parse_args(argv)
    try:
        did = build(args.force)
    except ProtocolBuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"{'built' if did else 'already built'}: {OUT_DIR}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
