"""Shared plumbing for the REGRAB pipeline: config, Parquet I/O, schemas, Wikidata, report."""
