"""nestflex's benchmarks: scripts grouped by the question they answer (README.md), run by path.

A package only so that the scripts share ``benchmarks._common`` and their group's ``_``-modules;
it is not installed and the library never imports it.
"""
