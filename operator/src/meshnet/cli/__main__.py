"""`python -m meshnet.cli` runs the `meshnet` command."""

from meshnet.cli.main import main

main()
