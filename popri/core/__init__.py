"""Plumbing every layer uses: ``errors``, ``io`` (formats, atomic writes), ``log``, ``runtime``,
``validate`` (number checks), ``compat`` (library-version feature detection), ``guard`` (output
overwrite checks), ``spec`` (the spec dataclass machinery), ``artifacts`` (sidecars, fingerprints,
digests)."""
