"""``python -m jepsen.docker build|build-spark|up|down|status|groups-file`` — the image and the compose group from a shell.

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
    bs = sub.add_parser(
        "build-spark",
        help="build ledgermq-spark (the project image + a JRE + this host's pyspark, pandas, pyarrow)",
    )
    bs.add_argument("--tag", default="ledgermq-spark:latest")
    bs.add_argument("--base-image", default=None, help="default: the project image's base image")
    for name, text in (
        ("up", "build if needed, start the group, wait until healthy and a master is routed"),
        ("down", "stop the group and remove its containers, network and volumes"),
        ("status", "print each service's address, health and broker role"),
    ):
        sp = sub.add_parser(name, help=text)
        sp.add_argument("-p", "--project", default="ledgermq", help="compose project name")
        sp.add_argument("--groups", type=int, default=1, help="broker groups of 3 (default 1)")
        sp.add_argument(
            "--spark",
            action="store_true",
            help="with docker-compose.spark.yml's master, worker and Connect server",
        )
    gf = sub.add_parser(
        "groups-file", help="print the override file that adds broker groups 2..N to docker-compose.yml"
    )
    gf.add_argument("groups", type=int, help="broker groups in all (2 or more)")
    gf.add_argument("-o", "--output", default=None, help="write it here instead of stdout")
    args = p.parse_args(argv)

    if args.cmd == "groups-file":
        from .layout import groups_override

        try:
            text = groups_override(args.groups)
        except ValueError as exc:
            print(f"groups-file: {exc}", file=sys.stderr)
            return 2
        if args.output:
            with open(args.output, "w", encoding="utf-8") as f:
                f.write(text)
        else:
            sys.stdout.write(text)
        return 0

    if args.cmd == "build-spark":
        from .images import ImageBuildError, build_spark_image

        try:
            build_spark_image(args.tag, base_image=args.base_image, log=lambda m: print(m, file=sys.stderr))
        except ImageBuildError as exc:
            print(f"build-spark failed: {exc}", file=sys.stderr)
            return 1
        return 0

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

    try:
        group = ComposeGroup(project=args.project, groups=args.groups, spark=args.spark)
    except ValueError as exc:
        print(f"{args.cmd}: {exc}", file=sys.stderr)
        return 2
    if args.cmd == "up":
        group.up()
        for name in group.broker_names:
            master = asyncio.run(group.wait_for_master(group=name))
            print(f"{name} up; master: {master} ({group.broker_addr(master)})")
        if group.spark:
            print(
                f"Spark: {group.spark_master_url}, Connect {group.spark_connect_url}; runs folder {group.runs_dir}"
            )
    elif args.cmd == "down":
        group.down()
    else:
        print(json.dumps(asyncio.run(group.status()), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
