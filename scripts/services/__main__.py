"""``python3 scripts/services install|smoke ...``: the same CLI as services.py."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from services import main

sys.exit(main())
