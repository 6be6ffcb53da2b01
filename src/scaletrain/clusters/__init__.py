"""Cluster profiles (data files, one per cluster), loading, and probing an unknown cluster."""
