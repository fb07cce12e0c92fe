"""`python -m transforms`: the transform as a filter."""

from __future__ import annotations

import sys

from transforms.cli import main

sys.exit(main())
