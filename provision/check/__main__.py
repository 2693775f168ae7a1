"""`python -m provision.check` is bin/envcheck."""

from provision.check.cli import main
from provision.jsonout import run_click

if __name__ == "__main__":
    run_click(main, "bin/envcheck", legacy_json_file=True)
