"""What one lesson alone uses, beside its script when the script would pass ~300 lines."""
