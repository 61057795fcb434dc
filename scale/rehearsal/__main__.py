"""``python -m scale.rehearsal``: the CPU rehearsal (:mod:`scale.rehearsal.run`)."""

import sys

from .run import main

sys.exit(main())
