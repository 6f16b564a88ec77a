"""python -m popri_cli ... == popri ..."""

from .cli import main

main()
