"""The node's request handlers, by concern. Each receives the collaborators it uses (the metadata
log, the replica groups, the registry, ...) from the node core, which routes every request
through its one door (NodeCore.handle: authorization, quotas, then the handler)."""
