"""Reading the rows of planned versions: one interface, and its sequential implementation as the reference.

A :class:`PlanReader` takes planned versions in order and gives back each plan
with the rows of its tasks, task by task, batch by batch. Whatever a reader
does to be fast (read ahead on threads, in other processes), its rows, their
order and their batch boundaries are those of :class:`SequentialReader`, and
an error is raised only after every row before it; the tests hold every
implementation to that.
"""

from __future__ import annotations

from collections.abc import Generator, Iterable, Iterator
from typing import Protocol

import pyarrow as pa

from deltatail.state.planning import VersionPlan
from deltatail.tailer.read.tasks import read_task
from deltatail.tailer.storage import Storage

#: A planned version and the rows of each of its tasks, in task order.
PlanRows = tuple[VersionPlan, Iterator[Iterable[pa.RecordBatch]]]


class PlanReader(Protocol):
    """Reads planned versions' rows (see the module docstring for the contract)."""

    def read(self, plans: Iterator[VersionPlan]) -> Generator[PlanRows, None, None]:
        """Each plan of ``plans`` with the rows of its tasks.

        An error raised by ``plans`` is raised here only after every plan before it
        was yielded. Close the generator (or exhaust it) to release what the reader
        holds (threads, processes).

        Raises:
            DeltaTailError: what planning or reading raises (a missing file, a bad DV...).
        """
        ...


class SequentialReader:
    """Reads each task when its turn comes, on the calling thread: the reference implementation."""

    def __init__(self, storage: Storage, batch_size: int = 65536) -> None:
        self.storage = storage
        self.batch_size = batch_size

    def read(self, plans: Iterator[VersionPlan]) -> Generator[PlanRows, None, None]:
        """See :meth:`PlanReader.read`."""
        for plan in plans:
            yield plan, (read_task(self.storage, plan.context_of(task), task, self.batch_size) for task in plan.tasks)
