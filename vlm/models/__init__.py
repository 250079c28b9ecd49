"""The PaliGemma core: SigLIP encoder (``siglip``), linear and Q-Former connectors (``connector``, ``qformer``), Gemma
decoder (``gemma``), the prefix-LM VLM (``paligemma``) and the one interface a task extends it through
(``extension``); it never imports :mod:`vlm.models.perception`. Import the modules directly: this package imports
nothing, so that the pack stage reads the image size rules (``image_size``) without the rest of the model code."""
