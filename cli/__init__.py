"""User commands that are not DVC stages (``stages/`` holds those).

Modules: ``predict`` (``regrab-predict``) and ``files`` (its input and output files),
``suggest`` (``regrab-suggest``: which sentence to label next), ``score`` (``regrab-score``),
``models`` (``regrab-models``), ``fewrel_submission`` (``regrab-fewrel-test``: answer files
for FewRel's hidden test set), ``guard`` (what every command does around its work: refuse an
output that is an input, end on SIGTERM with no output half-written, escape what it prints),
``text`` (control characters and lone surrogates in user text), ``limits`` (bounds on seeds,
threads and episodes, from the machine), ``entry`` (the console scripts, which handle SIGTERM
before they import their command).
"""
