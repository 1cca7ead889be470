"""``mtpscope diagnose``: from "acceptance is low" to ranked causes with evidence (docs/DIAGNOSE.md).

The area on top of the trace areas: it runs the existing steps in order and reads them together; it
implements none of them again. One job per module:

* :mod:`records` -- the findings' records (``Finding``, ``Evidence``, ``Fix``, ``ViewRef``, ``Diagnosis``),
  the documented cause list (``CAUSES``), and their JSON written and read back (``Diagnosis.from_dict``);
* :mod:`config` -- the run parameters of one diagnosis (``DiagnoseConfig``: the recording's, the replayed sample);
* :mod:`files` -- step 1: the drafter's and the pair's ``verify`` with the runtime verdicts, as findings;
* :mod:`published` -- step 2: the drafter's metadata against the published Gemma 4 configurations;
* :mod:`behaviour` -- steps 4 and 7: ``explain`` and the advice as findings (n_draft) and the sentence of
  what limits acceptance;
* :mod:`variants` -- step 5: replay under each convention variant;
* :mod:`reference` -- step 6: the same steps through a reference drafter, and the two files' differences;
* :mod:`rank` -- merging findings about one thing and the ranking;
* :mod:`run` -- ``diagnose(config, ...)``: the steps in order (step 3, the recording, included).

No imports here: importing a module of the package runs nothing else.
"""
