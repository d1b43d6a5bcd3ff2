"""The speed verdict: the custom path against eager and torch.compile, timed side by side by one engine, then gated."""
