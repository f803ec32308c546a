"""The Spark source's options (names as Delta's change data feed source; see :mod:`sinks.spark.source`).

The table's format (:mod:`tailer.formats`): a path written with a format's prefix (``lance://PATH``)
or the option ``format`` (``delta``, ``lance``, ``iceberg``) names it; without either,
:meth:`SourceOptions.resolved` looks at the layout (a ``_versions/`` directory with manifests is a
Lance dataset), as the command line does.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TypeVar

from pyspark.sql.streaming.datasource import ReadLimit, ReadMaxBytes, ReadMaxFiles

from deltatail.state.errors import ConfigError
from deltatail.state.paths import check_external_root
from deltatail.tailer.formats.base import DATA_LOSS, KEY, MAX_BYTES, NET_CHANGES, SPLIT
from deltatail.tailer.formats.registry import detect, format_named, split_prefix
from deltatail.tailer.parse import parse_bool, parse_bytes, parse_timestamp_ms
from deltatail.tailer.read.feed import ChangeOptions
from deltatail.tailer.storage import Storage
from deltatail.tailer.storage.options import resolve_references
from deltatail.tailer.table import table_storage

#: Options with this prefix are the table's storage options (``storage.aws_region``...).
STORAGE_PREFIX = "storage."
#: Delta's default ``maxFilesPerTrigger``.
DEFAULT_MAX_FILES = 1000
#: The options a format may refuse (:meth:`~tailer.formats.base.TableFormat.refused`), by their names here.
REFUSABLE = {
    NET_CHANGES: "netChanges",
    KEY: "keyColumns",
    MAX_BYTES: "maxBytesPerTrigger",
    DATA_LOSS: "onDataLoss=resnapshot",
    SPLIT: "splitCommits=always",
}

T = TypeVar("T")


def _bool(name: str, raw: str) -> bool:
    return parse_bool(raw, name=f"option {name}")


#: The values of ``onDataLoss``.
DATA_LOSS_MODES = ("fail", "resnapshot", "skip")
#: The values of ``splitCommits`` (:func:`sinks.spark.admission.whole_unit` says what each splits).
SPLIT_MODES = ("auto", "never", "always")


def _split(raw: str) -> str:
    """``splitCommits``.

    Raises:
        ConfigError: for a value that is none of :data:`SPLIT_MODES`.
    """
    mode = raw.strip().lower()
    if mode not in SPLIT_MODES:
        raise ConfigError(f"option splitCommits must be one of {', '.join(SPLIT_MODES)}, got {raw!r}")
    return mode


def _data_loss(opts: Mapping[str, str]) -> str:
    """``onDataLoss``, or Delta's ``failOnDataLoss`` (``false`` is ``skip``); both must agree.

    Raises:
        ConfigError: for a value that is none of :data:`DATA_LOSS_MODES`, or one that contradicts
            ``failOnDataLoss``.
    """
    fail = _bool("failOnDataLoss", opts.get("failondataloss", "true"))
    raw = opts.get("ondataloss")
    if raw is None:
        return "fail" if fail else "skip"
    mode = raw.strip().lower()
    if mode not in DATA_LOSS_MODES:
        raise ConfigError(f"option onDataLoss must be one of {', '.join(DATA_LOSS_MODES)}, got {raw!r}")
    if "failondataloss" in opts and fail != (mode == "fail"):
        raise ConfigError(f"options onDataLoss={mode} and failOnDataLoss={opts['failondataloss']} contradict")
    return mode


def _timestamp(raw: str) -> int:
    return parse_timestamp_ms(raw, name="option startingTimestamp")


def _count(name: str, raw: str, minimum: int) -> int:
    text = raw.strip()
    if not text.isdigit() or int(text) < minimum:
        raise ConfigError(f"option {name}={raw!r} is not an integer >= {minimum}")
    return int(text)


@dataclass(frozen=True, slots=True)
class SourceOptions:
    """The parsed options of one ``load``; see the module docstring for their meaning."""

    path: str
    starting_version: int | None = None
    starting_latest: bool = False
    starting_timestamp_ms: int | None = None
    ending_version: int | None = None
    initial_snapshot: bool | None = None
    max_files: int | None = None
    max_bytes: int | None = None
    net_changes: bool = False
    key_columns: tuple[str, ...] = ()
    #: ``onDataLoss``: ``fail``, ``resnapshot`` or ``skip`` (``failOnDataLoss=false`` is ``skip``).
    on_data_loss: str = "fail"
    #: ``splitCommits``: ``auto``, ``never`` or ``always`` (:func:`sinks.spark.admission.whole_unit`).
    split_commits: str = "auto"
    #: The format's name when known (a ``lance://`` path, the ``format`` option, or :meth:`resolved`).
    table_format: str | None = None
    #: ``externalRoots``: comma-separated roots outside the table its log may name (:mod:`state.paths`).
    external_roots: tuple[str, ...] = ()
    #: ``storage.KEY`` options: the table's object-store options (never shown; not in offsets).
    storage_options: dict[str, str] = field(default_factory=dict, repr=False, compare=False)

    @staticmethod
    def parse(options: Mapping[str, str]) -> SourceOptions:
        """Parse Spark's (case-insensitive) option map; unknown options are ignored, as Spark sources do.

        Raises:
            ConfigError: if the path is missing, a value is malformed, both starting options are
                given, ``keyColumns`` is given without ``netChanges``, an ``externalRoots`` entry is not
                an absolute path or URI, a ``storage.*`` value's ``env:NAME`` or ``@FILE`` reference
                cannot be resolved (see :func:`~tailer.storage.options.resolve_references`), or ``format`` names
                no format (or another than a ``lance://`` path's).
        """
        opts = {k.lower(): v for k, v in options.items()}
        path = opts.get("path")
        if not path:
            raise ConfigError('no table path: use .load("/path/to/table")')
        raw = opts.get("format")
        given = None if raw is None else format_named(raw.strip().lower(), setting="option format").name
        path, named = split_prefix(
            path, given, conflict=lambda uri, prefix, name: f"{uri} is a {prefix} path, but format={name} was given"
        )
        fmt = None if named is None else named.name
        start = opts.get("startingversion")
        latest = start is not None and start.strip().lower() == "latest"
        keys = tuple(k.strip() for k in opts.get("keycolumns", "").split(",") if k.strip())
        parsed = SourceOptions(
            path=path,
            starting_version=None if start is None or latest else _count("startingVersion", start, 0),
            starting_latest=latest,
            starting_timestamp_ms=_maybe(
                opts, "startingtimestamp", lambda v: parse_timestamp_ms(v, name="option startingTimestamp")
            ),
            ending_version=_maybe(opts, "endingversion", lambda v: _count("endingVersion", v, 0)),
            initial_snapshot=_maybe(opts, "initialsnapshot", lambda v: _bool("initialSnapshot", v)),
            max_files=_maybe(opts, "maxfilespertrigger", lambda v: _count("maxFilesPerTrigger", v, 1)),
            max_bytes=_maybe(opts, "maxbytespertrigger", lambda v: parse_bytes(v, name="option maxBytesPerTrigger")),
            net_changes=_bool("netChanges", opts.get("netchanges", "false")),
            key_columns=keys,
            on_data_loss=_data_loss(opts),
            split_commits=_split(opts.get("splitcommits", "auto")),
            table_format=fmt,
            external_roots=tuple(
                check_external_root(r.strip()) for r in opts.get("externalroots", "").split(",") if r.strip()
            ),
            storage_options=resolve_references(
                {k[len(STORAGE_PREFIX) :]: v for k, v in opts.items() if k.startswith(STORAGE_PREFIX)},
                where="the source's storage.* options",
            ),
        )
        if start is not None and parsed.starting_timestamp_ms is not None:
            raise ConfigError("give startingVersion or startingTimestamp, not both")
        if keys and not parsed.net_changes:
            raise ConfigError("keyColumns only applies with netChanges=true")
        return parsed if fmt is None else parsed.resolved()

    def resolved(self) -> SourceOptions:
        """These options with the table's format known (looking at the layout when not given).

        Raises:
            ConfigError: for options the format refuses (a Lance dataset: ``netChanges``,
                ``keyColumns``, ``maxBytesPerTrigger``; ``splitCommits=always`` on anything but a Delta
                table), or storage options for a local path.
        """
        if self.table_format is None:
            return replace(self, table_format=detect(self.path, self.storage()).name).resolved()
        fmt = format_named(self.table_format, setting="option format")
        given = {
            NET_CHANGES: self.net_changes,
            KEY: bool(self.key_columns),
            MAX_BYTES: self.max_bytes is not None,
            DATA_LOSS: self.on_data_loss == "resnapshot",
            SPLIT: self.split_commits == "always",
        }
        refused = [REFUSABLE[k] for k in fmt.refused([k for k, on in given.items() if on])]
        if refused:
            raise ConfigError(
                f"option {', '.join(refused)} applies to Delta tables, not to {fmt.noun}s "
                "(maxFilesPerTrigger limits its micro-batches)",
                table=self.path,
            )
        return self

    @property
    def fail_on_data_loss(self) -> bool:
        """Whether a version the log no longer holds is an error (``onDataLoss=fail``, the default)."""
        return self.on_data_loss == "fail"

    @property
    def has_start(self) -> bool:
        """Whether ``startingVersion`` or ``startingTimestamp`` was given."""
        return self.starting_latest or self.starting_version is not None or self.starting_timestamp_ms is not None

    def storage(self) -> Storage:
        """The table's storage (an object store's client built from ``storage_options`` and the environment).

        Raises:
            ConfigError: if storage options are given for a local path, or are malformed.
        """
        return table_storage(self.path, self.storage_options)

    def change_options(self) -> ChangeOptions:
        """The :class:`~tailer.read.feed.ChangeOptions` these options ask for.

        Planning crosses every schema change (``allow_non_additive``): what a query can read is
        decided by its fixed schema alone (:func:`sinks.spark.schema.check_fits`).
        """
        return ChangeOptions(
            net_changes=self.net_changes,
            key_columns=self.key_columns,
            allow_non_additive=True,
            external_roots=self.external_roots,
        )

    def read_limit(self) -> ReadLimit:
        """The default read limit: the file limit (Delta's 1000 unless only a byte limit is set), else bytes."""
        if self.max_files is not None or self.max_bytes is None:
            return ReadMaxFiles(self.max_files or DEFAULT_MAX_FILES)
        return ReadMaxBytes(self.max_bytes)


def _maybe(opts: Mapping[str, str], name: str, parse: Callable[[str], T]) -> T | None:
    raw = opts.get(name)
    return None if raw is None else parse(raw)
