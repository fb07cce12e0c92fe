"""`python -m fedload`: the fedload command line."""

import sys

from fedload.cli import main

sys.exit(main())
