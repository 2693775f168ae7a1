"""Test-only helpers: real local conda channels and a relocatable toolchain stand-in."""
