"""`python -m trainer.launch` (what bin/train runs): the launcher lives in trainer/launcher/."""

from __future__ import annotations

import sys

from trainer.launcher.main import main

if __name__ == "__main__":
    sys.exit(main())
