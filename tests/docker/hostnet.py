"""What the host's network namespace holds, to show the Docker engine left it alone."""

from __future__ import annotations

import re
import shutil
import subprocess


def _out(argv: list[str]) -> str:
    if shutil.which(argv[0]) is None:
        return f"({argv[0]} not installed)"
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    return done.stdout + done.stderr


def host_network() -> dict[str, str]:
    """Links, addresses and firewall rules of this process's network namespace.

    Packet counters are dropped: traffic changes them, rules do not.
    """
    iptables = "\n".join(
        re.sub(r"\[\d+:\d+\]", "", line)
        for line in _out(["iptables-save"]).splitlines()
        if not line.startswith("#")
    )
    nft = re.sub(r"counter packets \d+ bytes \d+", "counter", _out(["nft", "list", "ruleset"]))
    return {
        "links": _out(["ip", "-o", "link"]),
        "addresses": _out(["ip", "-o", "addr"]),
        "routes": _out(["ip", "route"]),
        "iptables": iptables,
        "nft": nft,
    }
