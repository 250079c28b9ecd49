"""The data path from JPEGs to training batches.

Modules (import them directly; this package imports nothing so that the packing workers stay
free of torch):

- ``pack``: the ``pack_hdf5`` stage's logic (JPEG decode, parallel, streamed HDF5 writes)
- ``h5file``: the packed-file layout, its writer and its fork-safe reader
- ``dataset``: ``TrafficVQADataset`` (one sample per question, pre-tokenised)
- ``collate``: ``collate_questions`` (the Batch contract, dynamic padding, one copy per image)
- ``sampler``: ``GroupedBatchSampler`` (an image's questions in one batch; DDP aware)
- ``augment``: ``AugmentConfig`` (per image and epoch; flip swaps left/right in the text)
- ``loader``: ``build_loader`` / ``set_epoch``
- ``naive``, ``profile``: the textbook baseline loader and the ``profile_dataloader`` stage
"""
