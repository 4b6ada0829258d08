"""ZooKeeper and the ClickHouse clusters that need it (or weights) for the cluster work (issue 14).
"""

from __future__ import annotations

from pathlib import Path

from services import apt_install

ZOOKEEPER_JARS = Path("/usr/share/java")


def install_zookeeper() -> Path:
    """Debian's ``zookeeper`` (3.8): jars only, no service (``zookeeperd`` would add one)."""
    if not (ZOOKEEPER_JARS / "zookeeper.jar").exists():
        apt_install("zookeeper", recommends=False)
    return ZOOKEEPER_JARS / "zookeeper.jar"
