"""GPU tests (marker ``gpu``): a package, so its conftest does not shadow tests/conftest.py."""
