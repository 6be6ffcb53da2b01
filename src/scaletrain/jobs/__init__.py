"""After submit: follow a job (status, logs), stop it safely (cancel), see what it did (report)."""
