"""One module per DVC stage; each has a ``main()`` that takes paths as arguments.

Importing the package (as ``python -m stages.<name>`` does) declares the catalog of
``params.yaml``'s sections: :data:`SECTION_OWNERS` names, for each section, the module whose
import registers its schema (``@register_section``). A stage's ``load_section`` then refuses a
misspelt section without importing every schema; ``pipeline.sections.all_sections()``
imports them all (the configuration docs, the override checks, the tests).
"""

from pipeline.sections import declare_sections

#: ``params.yaml`` section -> the module that registers its schema. A new section is one
#: ``register_section`` in the module of its dataclass plus one line here.
SECTION_OWNERS = {
    "benchmarks": "pipeline.config",
    "fetch": "pipeline.sources",
    "prepare_fewshot": "pipeline.data_sections",
    "split_nyt": "pipeline.data_sections",
    "split_fewrel": "pipeline.data_sections",
    "prepare_own": "model.own_data",
    "evaluate_own": "model.evaluation.own_config",
    "train_transe": "model.transe.config",
    "build_graph": "model.prior.config",
    "model": "model.config",
    "train": "model.training.config",
    "comparison": "model.training.config",
    "evaluate": "model.evaluation.config",
    "transfer": "model.evaluation.config",
    "active_labelling": "model.predict.config",
    "tune_splits": "pipeline.data_sections",
    "promote": "pipeline.gate",
}

declare_sections(SECTION_OWNERS)
