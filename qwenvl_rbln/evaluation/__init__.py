"""``qvl eval``: a visual question set run through the batch job, then scored with the field's rules and reported
with honest error bars (docs/eval.md).

Pure and small on purpose: ``normalize`` (VQA answer normalization, ANLS), ``scoring`` (one item right or wrong),
``stats`` (Wilson, exact McNemar, Newcombe's paired interval), ``items`` (a question and its request), ``dataset``
and ``easy_vqa`` (the question set), ``results`` (the files beside the batch job's results file), ``report``
(accuracy, categories, the paired comparison) and ``gates`` (the CI thresholds). Running the set is the batch job's
(``batch/``), never copied here.
"""
