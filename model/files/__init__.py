"""Files a model lives in: safetensors + JSON, checkpoints and exported model folders.

Modules:
    tensor_file: the safetensors + JSON file format (loading runs no code).
    checkpoint: the typed checkpoint record and its file, and converting older pickles.
    score_quantiles: what a checkpoint keeps of the model's uncertainty on validation
        relations (what ``regrab-predict`` abstains by).
    suspicion_cutoff: what a checkpoint keeps to flag mislabelled support sentences by.
    model_folder: a trained model exported as a folder with its model card.
    loader: a model rebuilt from a checkpoint file or an exported folder alone.
"""
