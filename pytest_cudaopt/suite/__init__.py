"""The verdict suite that the plugin collects for every workdir (see `items.py`)."""
