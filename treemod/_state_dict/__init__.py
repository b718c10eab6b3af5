"""PyTorch-named state dicts of treemod models: `state_dict`, `load_state_dict` (see README.md)."""
