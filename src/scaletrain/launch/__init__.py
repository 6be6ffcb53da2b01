"""Local launch: `scaletrain run`, built on torch's elastic agent."""
