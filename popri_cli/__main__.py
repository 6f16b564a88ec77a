"""python -m popri_cli ... (deprecated) == popri ..."""

from popri.cli.app import main

if __name__ == "__main__":
    main()
