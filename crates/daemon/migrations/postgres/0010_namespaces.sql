-- Namespaces (`host ns add NAME ...`), the same for every node: each one's
-- weight, quotas and granted secrets as JSON (`NamespaceSettings`). The
-- default namespace is here only once its operator changes it.
CREATE TABLE taskhost_namespaces (
    name     TEXT PRIMARY KEY,
    settings TEXT NOT NULL
);
-- Each task's namespace, from its name ('' for the default one): a node
-- claims ready work namespace by namespace, in proportion to their
-- weights, each namespace's in priority and id order.
ALTER TABLE taskhost_tasks ADD COLUMN ns TEXT GENERATED ALWAYS AS (
    CASE WHEN strpos(name, chr(31)) > 0 THEN split_part(name, chr(31), 1) ELSE '' END
) STORED;
CREATE INDEX taskhost_ready_ns ON taskhost_tasks (ns, priority DESC, id) WHERE state = 'ready';
