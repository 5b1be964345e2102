import sys

from specsure.cli.main import main

sys.exit(main())
