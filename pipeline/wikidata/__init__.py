"""Reading Wikidata JSON dumps and triple files into deduplicated (head, relation, tail) ids.

Read top to bottom, one module per step:

* :mod:`~pipeline.wikidata.formats`: what an input is (compression, dump or triples).
* :mod:`~pipeline.wikidata.parse`: batches of whole lines into triples (pure functions).
* :mod:`~pipeline.wikidata.bz2blocks`: bzip2 blocks found and decoded from any byte offset.
* :mod:`~pipeline.wikidata.ranges`: byte ranges as independent work units.
* :mod:`~pipeline.wikidata.collect`: finished ranges on disk (resume) and their merge.
* :mod:`~pipeline.wikidata.engine`: running the ranges in-process or on Dask.
* :mod:`~pipeline.wikidata.tables`: deduplication and the output tables.

The parse_wikidata stage calls them.
"""
