"""The `meshnet` command line; each command group lives in its own module."""
