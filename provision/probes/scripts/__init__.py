"""The probe programs bin/envcheck runs, one file each (see provision/probes/__init__.py).

Each is a standalone script for the env's python: it imports only the standard library, what it
probes (torch, triton) and `envcheck_probe_common` (common.py, copied beside it into the probe's
scratch dir), takes one JSON argument and prints one `ENVCHECK_RESULT=<json>` line.
"""
