"""`python -m specsure.bench` runs `specsure bench`."""

import sys

from specsure.bench.cli import main

sys.exit(main())
