"""Sans-IO wire protocol: framing, typed requests and responses, replication messages."""
