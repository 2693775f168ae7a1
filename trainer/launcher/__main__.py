"""`python -m trainer.launcher` (what bin/train runs): the launcher's process entry.

The early signal capture runs before the heavy imports: a stop signal now is recorded, not fatal."""

from __future__ import annotations

import sys

if __name__ == "__main__":
    from trainer.launcher import early

    early.capture()
    from trainer.launcher.main import main

    sys.exit(main())
