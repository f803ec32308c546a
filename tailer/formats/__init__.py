"""Table formats behind one interface.

:mod:`~tailer.formats.base` is the seam, :mod:`~tailer.formats.registry` the list of formats and
the table handle's builder, and each format has one module (:mod:`~tailer.formats.delta`,
:mod:`~tailer.formats.lance`).
"""
