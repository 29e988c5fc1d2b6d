"""`python -m musicrel.cli`: the `musicrel` command without its console script (subprocesses)."""

import sys

from musicrel.cli import main

sys.exit(main())
