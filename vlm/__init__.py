"""Traffic-scene vision-language models: data generation, tokenizer, models, training and evaluation."""

__version__ = "0.1.0"
