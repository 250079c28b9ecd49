"""Questions about traffic scenes with answers derived from the labels alone."""
