-- The edges of a dependent (issue 33, item 7): delayq_deps's primary key starts
-- with the dependency (queue, task_id), which is how the release trigger and a
-- task's dependents read it; a task's own dependencies (the dashboard's task
-- page, 'delayq task show') and the workflow's walk towards them read it by the
-- dependent (dep_queue, dep_task_id), which without this index is a scan of
-- every edge still waiting. One more index entry per dependency enqueued and
-- settled: tasks without dependencies pay nothing. Concurrently, so that
-- producers keep writing while it builds.

-- +goose NO TRANSACTION

-- +goose Up
DROP INDEX CONCURRENTLY IF EXISTS {{schema}}.delayq_deps_dependent_idx;
CREATE INDEX CONCURRENTLY delayq_deps_dependent_idx
    ON {{schema}}.delayq_deps (dep_queue, dep_task_id);

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS {{schema}}.delayq_deps_dependent_idx;
