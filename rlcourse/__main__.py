"""``python -m rlcourse train --config FILE`` (see :mod:`rlcourse.capstone.cli`)."""
import sys

from .capstone.cli import main

sys.exit(main())
