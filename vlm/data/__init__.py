"""The data path from JPEGs to training batches (its modules: docs/architecture.md, code map). Import the modules
directly: this package imports nothing, so that the packing workers stay free of torch."""
