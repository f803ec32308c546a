"""Lance datasets: version discovery, manifests, deletion files and rows (IO), a change feed and a tailer.

Planning is pure and lives in :mod:`state.lance`; this package reads what planning needs through the
storage seam (:mod:`tailer.storage`) and reads rows with pylance (``pip install 'deltatail[lance]'``).
"""
