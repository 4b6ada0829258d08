"""engine.prefetch must never change the working directory off the main thread.

chDB's package import chdir's into site-packages while it loads its library; when that
import ran on the prefetch thread, a relative path resolved meanwhile (the default
./chload-data, a source glob) landed inside chDB's directory, about one run in ten.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import os, threading
    moves = []
    real = os.chdir
    def chdir(path):
        moves.append(threading.current_thread().name)
        real(path)
    os.chdir = chdir
    from chload.runtime import engine
    engine.prefetch()
    for thread in threading.enumerate():
        if thread.name.startswith("chload-"):
            thread.join(60)
    assert "chdb" not in sys.modules, "the package was imported by prefetch"
    assert moves == [], moves
    engine._import_chdb()  # the session's import (main thread) still works after it
    import chdb.session
    print("ok")
""").replace("import os, threading", "import os, sys, threading")


def test_prefetch_maps_the_library_without_importing_the_package() -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "ok"
