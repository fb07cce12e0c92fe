"""`python -m transforms`: the transform as a filter."""

import sys

from transforms.cli import main

sys.exit(main())
