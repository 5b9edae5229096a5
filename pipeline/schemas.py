"""Explicit pyarrow schemas for every artifact passed between stages.

Each schema is defined once here, next to nothing else, and used by both the
writer and the reader (``pipeline.io.write_parquet`` / ``read_parquet``).
Spans are half-open token ranges ``[start, end)``.
"""

from __future__ import annotations

import pyarrow as pa

#: One few-shot instance (a sentence with a head and tail entity mention).
FEWSHOT_SCHEMA = pa.schema(
    [
        pa.field("instance_id", pa.string(), nullable=False),
        pa.field("relation", pa.string(), nullable=False),
        pa.field("relation_name", pa.string(), nullable=False),
        pa.field("tokens", pa.list_(pa.string()), nullable=False),
        pa.field("head_start", pa.int32(), nullable=False),
        pa.field("head_end", pa.int32(), nullable=False),
        pa.field("tail_start", pa.int32(), nullable=False),
        pa.field("tail_end", pa.int32(), nullable=False),
        pa.field("head_id", pa.string()),
        pa.field("tail_id", pa.string()),
    ]
)

#: Wikidata triples (head item, property, tail item) and where they came from.
TRIPLES_SCHEMA = pa.schema(
    [
        pa.field("head", pa.string(), nullable=False),
        pa.field("relation", pa.string(), nullable=False),
        pa.field("tail", pa.string(), nullable=False),
        pa.field("source", pa.string(), nullable=False),
    ]
)

#: Relation catalogue: property id, English label, number of triples, English description
#: and aliases (empty list when none), and where the label and description came from
#: (``"dump"``: the property entity in a Wikidata dump; ``"pid2name"``: FewRel's
#: ``pid2name.json``; null when there is none).
RELATIONS_SCHEMA = pa.schema(
    [
        pa.field("relation", pa.string(), nullable=False),
        pa.field("label", pa.string()),
        pa.field("triple_count", pa.int64(), nullable=False),
        pa.field("description", pa.string()),
        pa.field("aliases", pa.list_(pa.string()), nullable=False),
        pa.field("label_source", pa.string()),
        pa.field("description_source", pa.string()),
    ]
)


#: The columns of ``RELATIONS_SCHEMA`` that the model reads (a relation's text): read with
#: this schema, a relations table keeps working when provenance columns are added.
RELATION_TEXT_SCHEMA = pa.schema([RELATIONS_SCHEMA.field(name)
                                  for name in ("relation", "label", "description")])

def embeddings_schema(dim: int) -> pa.Schema:
    """Relation embeddings: property id and a fixed-size float32 vector of ``dim``."""
    return pa.schema(
        [
            pa.field("relation", pa.string(), nullable=False),
            pa.field("embedding", pa.list_(pa.float32(), dim), nullable=False),
        ]
    )


#: Undirected relation graph, each edge listed in both directions.
GRAPH_SCHEMA = pa.schema(
    [
        pa.field("src", pa.string(), nullable=False),
        pa.field("dst", pa.string(), nullable=False),
        pa.field("weight", pa.float32(), nullable=False),
    ]
)
