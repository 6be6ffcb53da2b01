"""Distributed data: sharded loaders with exact resume, metric reductions, LR scaling."""
