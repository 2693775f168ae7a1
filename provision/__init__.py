"""provision: spec -> lock -> prefix -> hooks -> check, for a self-contained env with its own compilers.

Standard library and py-rattler only at import time; never imports trainer (tests/test_structure.py).
"""
