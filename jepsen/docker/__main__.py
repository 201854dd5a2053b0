"""``python -m jepsen.docker build|up|down|status`` — the image and the compose group from a shell.

``build`` needs only the standard library (it runs before the project is installed);
the other commands use ``ComposeGroup`` and so the project's own packages.
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m jepsen.docker", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="build the ledgermq image (base image, wheelhouse, docker build)")
    b.add_argument("--tag", default="ledgermq:latest")
    b.add_argument(
        "--base-image", default=None, help="default: python:3.11-slim, else a local debootstrap base"
    )
    b.add_argument("--refresh-deps", action="store_true", help="download the dependency wheels again")
    for name, text in (
        ("up", "build if needed, start the group, wait until healthy and a master is routed"),
        ("down", "stop the group and remove its containers, network and volumes"),
        ("status", "print each service's address, health and broker role"),
    ):
        sp = sub.add_parser(name, help=text)
        sp.add_argument("-p", "--project", default="ledgermq", help="compose project name")
    args = p.parse_args(argv)

    if args.cmd == "build":
        from .images import ImageBuildError, build_image

        try:
            build_image(
                args.tag,
                base_image=args.base_image,
                refresh_deps=args.refresh_deps,
                log=lambda m: print(m, file=sys.stderr),
            )
        except ImageBuildError as exc:
            print(f"build failed: {exc}", file=sys.stderr)
            return 1
        return 0

    import asyncio
    import json

    from .compose import ComposeGroup

    group = ComposeGroup(project=args.project)
    if args.cmd == "up":
        group.up()
        master = asyncio.run(group.wait_for_master())
        print(f"group up; master: {master} ({group.broker_addr(master)})")
    elif args.cmd == "down":
        group.down()
    else:
        print(json.dumps(asyncio.run(group.status()), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
