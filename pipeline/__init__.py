"""Shared plumbing for the REGRAB pipeline: config and its sections, Parquet I/O, schemas,
Wikidata, report and its detection and mislabelled-support tables, the active-labelling
summary."""
