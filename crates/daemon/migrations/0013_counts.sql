-- Counts the writer keeps as rows change, so that retention and plugin
-- collection read a few rows instead of every task kept: the finished
-- tasks and their bytes (request, report and log) in `meta`, and how many
-- unfinished and finished tasks of each namespace use each plugin. A
-- namespace is a name's part before the separator (char 31), '' for the
-- default one's.
CREATE TABLE plugin_uses (
    digest     BLOB    NOT NULL,
    ns         TEXT    NOT NULL,
    plugin     TEXT    NOT NULL,
    unfinished INTEGER NOT NULL,
    finished   INTEGER NOT NULL,
    PRIMARY KEY (digest, ns)
) WITHOUT ROWID;

INSERT INTO plugin_uses (digest, ns, plugin, unfinished, finished)
SELECT digest,
       CASE WHEN instr(name, char(31)) = 0 THEN ''
            ELSE substr(name, 1, instr(name, char(31)) - 1) END,
       max(plugin), sum(state <> 'finished'), sum(state = 'finished')
FROM tasks GROUP BY 1, 2;

INSERT OR REPLACE INTO meta (key, value)
SELECT 'finished_rows', count(*) FROM tasks WHERE state = 'finished';
INSERT OR REPLACE INTO meta (key, value)
SELECT 'finished_bytes',
       coalesce(sum(length(request) + coalesce(length(report), 0) + coalesce(length(log), 0)), 0)
FROM tasks WHERE state = 'finished';
