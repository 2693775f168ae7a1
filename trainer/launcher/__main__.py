"""`python -m trainer.launcher`: the same as bin/train."""

from __future__ import annotations

import sys

from trainer.launcher.main import main

sys.exit(main())
