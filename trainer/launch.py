"""`python -m trainer.launch` (what bin/train runs): the launcher lives in trainer/launcher/."""

from __future__ import annotations

import sys

if __name__ == "__main__":
    from trainer.launcher import early

    early.capture()  # before the heavy imports: a stop signal now is recorded, not fatal
    from trainer.launcher.main import main

    sys.exit(main())
