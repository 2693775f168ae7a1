"""`python -m provision.check` is bin/envcheck."""

from provision.check.cli import main

if __name__ == "__main__":
    main(prog_name="bin/envcheck")
