import sys

from chload.cli import main

sys.exit(main())
