"""REGRAB model components, one per file.

Rooms: ``encoder`` (sentence encoder with entity markers) and ``encoder_cache`` (CPU caching
of its frozen layers), ``graph_prior`` (GCN prior, paper Eq. 5-6, and the relation labels it
reads), ``langevin`` (the posterior target and the SGLD sampler, Eq. 9-10), ``regrab`` (the
REGRAB head and the MC predictive, Eq. 11), ``baselines`` (proto, mtb), ``registry`` (every
method by name and the interface their heads share), ``episodes`` (N-way K-shot sampling and
scoring), ``transe`` (relation embeddings), ``train_config`` / ``trainer`` / ``train_state``
(the ``train`` params, the training loop, resume and reuse), ``checkpoint`` (method configs
and every saved model, REGRAB and TransE alike), ``tensor_file`` (the safetensors + JSON file
format they share) and ``model_folder`` (a trained model exported with its model card).

Shape letters, used by every docstring and shape comment in the project:

====  ===============================================================
B     episodes in a batch
S     posterior samples (Langevin chains)
N     ways (relations of an episode)
K     shots (support sentences per way)
Q     queries of an episode (all ways together unless said otherwise)
L     tokens of a sentence
H     hidden size of the transformer
D     sentence-encoding size (2 H with marker pooling)
R     relations in the graph
F     node-feature size of the graph (TransE dimension)
E     edges of the graph
P     positive triples in a TransE batch (G chunks of C, with M negatives drawn per chunk)
====  ===============================================================
"""
