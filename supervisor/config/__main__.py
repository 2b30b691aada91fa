"""`python -m supervisor.config`: docs/env-vars.md on standard output (`make docs`)."""

import sys

from supervisor.config import reference

sys.stdout.write(reference())
