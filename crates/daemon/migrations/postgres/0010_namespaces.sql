-- Namespaces (`host ns add NAME ...`), the same for every node: each one's
-- weight, quotas and granted secrets as JSON (`NamespaceSettings`). The
-- default namespace is here only once its operator changes it.
CREATE TABLE taskhost_namespaces (
    name     TEXT PRIMARY KEY,
    settings TEXT NOT NULL
);
