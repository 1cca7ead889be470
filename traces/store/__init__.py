"""The trace store: the trace format and its files. Imports nothing above it; no eager imports here.

Bottom up: ``layout`` (file and folder names, listing, the lock; standard library only), ``schema``,
``records``, ``columns`` (records to Arrow tables), ``manifest`` (the manifest file), ``parts`` (how Parquet
files are written), ``wal`` (the write-ahead log and its recovery), ``merge`` (compaction), ``writer``
(``TraceWriter``, replacing a trace), ``protocols`` (``TraceLike``), ``checks`` (the rows' values), ``reader`` (``open_trace`` -> ``Trace``, ``read_manifest``: the
one door for reading), ``list_columns``.
"""
