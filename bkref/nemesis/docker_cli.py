"""``bkref docker``: the private Docker engine and the node images of campaigns."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bkref.nemesis.docker_engine import DEFAULT_DIR, DockerEngine, EngineError


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="bkref docker",
        description=(
            "A private Docker engine (Debian's dockerd, in a network namespace of its own, "
            "with its own data root and socket) for the Docker campaign backend."
        ),
    )
    sub = p.add_subparsers(dest="command", required=True)
    engine = sub.add_parser("engine", help="start, stop or show the private engine")
    engine.add_argument("action", choices=["start", "stop", "status"])
    engine.add_argument(
        "--dir", type=Path, default=DEFAULT_DIR, help=f"the engine's files (default {DEFAULT_DIR})"
    )
    build = sub.add_parser(
        "build",
        help="build the node image bkref-node:latest (starts the engine if needed); "
        "prints each step's time",
    )
    build.add_argument(
        "--dir", type=Path, default=DEFAULT_DIR, help=f"the engine's files (default {DEFAULT_DIR})"
    )
    return p


def _build(engine: DockerEngine) -> int:
    from bkref.nemesis.docker_images import IMAGE, ImageError, build, image_size

    started = engine.start()
    if started:
        print(f"engine up in {started:.1f}s (netns {engine.netns})")
    try:
        times = build(engine.client(), log=engine.directory / "image-build.log")
    except ImageError as e:
        print(f"bkref docker build: {e}", file=sys.stderr)
        return 2
    size = image_size(engine.client()) / 1e6
    print(f"{IMAGE} built in {times}; {size:.0f} MB")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.dir.exists() and not args.dir.is_dir():
        print(f"bkref docker: --dir {args.dir}: not a directory", file=sys.stderr)
        return 2
    engine = DockerEngine(args.dir)
    try:
        if args.command == "build":
            return _build(engine)
        if args.action == "start":
            took = engine.start()
            print(f"engine up in {took:.1f}s: DOCKER_HOST={engine.host} (netns {engine.netns})")
        elif args.action == "stop":
            removed = engine.stop()
            print("stopped; removed: " + (", ".join(removed) if removed else "nothing"))
        else:
            status = engine.status()
            print(status.detail)
            return 0 if status.running else 3
    except EngineError as e:
        print(f"bkref docker: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
