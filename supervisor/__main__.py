"""`python -m supervisor` is the same as the `elastic-supervisor` console script."""

import sys

from supervisor.cli import main

sys.exit(main())
