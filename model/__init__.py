"""REGRAB's model code, in packages named by what they hold.

Packages (each ``__init__`` names its modules): ``encoder`` (sentence encoder with entity
markers, the frozen-layer cache, encoder files), ``prior`` (relation graph and the GCN prior,
paper Eq. 5-6, and the relation text it reads), ``posterior`` (the posterior target and the
SGLD sampler, Eq. 7-10, and prototype logits), ``methods`` (REGRAB, its baselines and their
registry), ``files`` (safetensors + JSON files, checkpoints, exported model folders),
``training`` (the ``train`` params, the loop, resume and reuse), ``evaluation`` (scoring
splits, calibration, NOTA, transfer), ``transe`` (relation embeddings) and ``predict`` (a
trained model on a user's sentences). ``episodes`` (N-way K-shot sampling) serves them all,
and ``config`` holds the ``model`` params section and the config a model is rebuilt from.

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
