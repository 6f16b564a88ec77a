"""Every ``popri`` command's arguments as a :class:`~popri.core.spec.Call` (one module per
module of popri/cli/commands)."""
