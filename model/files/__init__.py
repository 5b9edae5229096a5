"""Files a model lives in: safetensors + JSON, checkpoints and exported model folders.

Modules:
    tensor_file: the safetensors + JSON file format (loading runs no code).
    checkpoint: method configs, building a model, and saving and loading checkpoints.
    model_folder: a trained model exported as a folder with its model card.
"""
