"""python -m popri ... == popri ..."""

from popri.cli.app import main

if __name__ == "__main__":
    main()
