"""Tools for your own tests and benchmarks, not for the device: :mod:`.link` (a link emulator
over real sockets, with bandwidth traces) and :mod:`.corruption` (a corpus of damaged bundles).
Nothing in :mod:`nestflex.deploy` imports them; :mod:`.corruption` builds its bundles with the
training side (torch).
"""
