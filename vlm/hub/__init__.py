"""The default model in transformers (``trust_remote_code``): its config and model classes, and the project modules
they import, which the export (vlm/export.py) writes into the folder as transformers' remote code."""
