"""`python -m moe_build ...` is the `moe-build` command."""
from .cli import main

main()
