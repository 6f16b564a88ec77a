"""``popri run``: the config (``config``), cached stages (``stages``), method recipes and the
driver (``driver``)."""
