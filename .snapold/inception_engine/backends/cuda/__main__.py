"""``python -m inception_engine.backends.cuda --selftest ...``: selftest.py's command."""

import sys

from .selftest import main

sys.exit(main())
