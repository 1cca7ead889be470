"""Importers: foreign logs -> trace directories (one module per format; the shared parts in ``common``).

* :func:`import_fork_ndjson` reads the NDJSON the fork writes when ``LLAMA_MTP_ACC_TRACE`` is set::

      {"evt":"mtp_draft","iter":12,"path":"sync","seq_id":0,"id_last":818,"h_idx":0,"attn_pos":57,
       "n_steps":3,"h_l2":93.1,"drafts":[236743,532,19]}
      {"evt":"mtp_accept","iter":12,"n_accepted":2,"n_drafted_prev":3}

  Draft and accept events are joined on ``iter``. Each joined pair is one round: ``pending_token`` =
  ``id_last``, ``pos`` = ``attn_pos``, ``drafted`` = ``drafts``, ``n_accepted`` from the accept event,
  ``draft_path`` = ``path``, ``h_l2`` = ``h_l2``. The log has no target tokens, emitted tokens,
  logits or timings: those columns are null (never invented). Steps get ``k``, ``token`` and
  ``accepted`` (``k <= n_accepted``) only. The fork counts ``iter`` per sequence and advances it at
  each accept, so a second draft at the same ``iter`` means the first was never verified (it is
  reported, not imported). The file is appended across runs: ``iter`` going backwards for a
  ``seq_id`` starts a new run (*segment*). The log marks no request boundaries; within one
  (segment, ``seq_id``) stream a new prompt starts where ``attn_pos`` goes down (positions only grow
  within one generation), so ``prompt_id`` counts such streams/requests, and ``manifest.prompts``
  records ``seq_id``, ``segment`` and ``first_line`` for each. Accept events carry no ``seq_id``:
  with several slots an accept is paired with the oldest open draft of the same ``iter`` (warned).
  Lines may carry a log prefix (stderr capture): the JSON object is taken from the first ``{"evt"``.
  Lines that neither start with ``{`` / ``[`` nor contain ``{"evt"`` (other log output) and events of
  other kinds are ignored and counted; every other line that cannot be used (invalid JSON, not an
  object, no ``evt``, missing or mistyped fields, more accepted than drafted) is *bad* and reported
  with its line number.

* :func:`import_server_log` reads llama-server output: the per-slot line
  ``draft acceptance rate = 0.57143 (  4 accepted /   7 generated)`` (newer servers:
  ``draft acceptance = ... , mean len = 1.57``), with the slot prefix ``id N | task M |`` when present (the
  vendored server prints it after a log prefix such as ``0.35.364.818 I slot print_timing:``), the
  ``prompt eval time`` / ``eval time`` lines before it (tokens and milliseconds, tokens per second),
  and per-response JSON with ``timings.draft_n`` / ``timings.draft_n_accepted`` (a JSON object per line,
  optionally after ``data: `` as in streamed responses). Each becomes one row of ``requests``
  (schema ``traces.store.schema.REQUESTS_SCHEMA``); rounds and steps stay empty.

Both return an :class:`ImportResult` and raise :class:`ImportFormatError` when not a single line
could be used.
"""

from mtpscope.traces.importers.common import ImportResult
from mtpscope.traces.importers.fork_ndjson import import_fork_ndjson
from mtpscope.traces.importers.server_log import import_server_log

__all__ = ["ImportResult", "import_fork_ndjson", "import_server_log"]
