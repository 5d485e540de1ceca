package schedrun

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/delayq/delayq/delayqtype"
	"github.com/delayq/delayq/outbox"
	"github.com/delayq/delayq/schedule"
)

// List reads the states of every schedule a runner evaluated in schema, by
// name, then adds those of declared (a client's, a file's) that no runner
// evaluated yet, with their next tick from now.
func List(ctx context.Context, q outbox.Querier, schema string, declared []schedule.Schedule) ([]delayqtype.ScheduleState, error) {
	rows, err := q.Query(ctx, fmt.Sprintf(`SELECT name, queue, spec, time_zone, last_enqueued, next_tick, enqueued, missed, updated_at,
    paused_at, COALESCE(last_run_id, ''), last_run_at
FROM "%s".%s ORDER BY name`, schema, tableName))
	if err != nil {
		return nil, fmt.Errorf("schedules: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (delayqtype.ScheduleState, error) {
		var s delayqtype.ScheduleState
		var next *time.Time
		err := r.Scan(&s.Name, &s.Queue, &s.Spec, &s.TimeZone, &s.LastTick, &next, &s.Enqueued, &s.Missed, &s.UpdatedAt,
			&s.PausedAt, &s.LastRunID, &s.LastRunAt)
		s.Paused = s.PausedAt != nil
		if s.TimeZone == "" { // a row no runner of 00018 on evaluated yet
			s.TimeZone = "UTC"
		}
		setNext(&s, next)
		return s, err
	})
	if err != nil {
		return nil, fmt.Errorf("schedules: %w", err)
	}
	return append(out, Declared(declared, time.Now(), out)...), nil
}

// Declared returns the states of the schedules of declared not in seen, by what
// they declare: no last tick, the next one after now.
func Declared(declared []schedule.Schedule, now time.Time, seen []delayqtype.ScheduleState) []delayqtype.ScheduleState {
	known := map[string]bool{}
	for _, s := range seen {
		known[s.Name] = true
	}
	var out []delayqtype.ScheduleState
	for _, s := range declared {
		if known[s.Name] {
			continue
		}
		st := delayqtype.ScheduleState{Name: s.Name, Queue: s.Queue, TimeZone: zoneName(s)}
		if spec, err := Compile(s); err == nil {
			st.Spec = spec.Text
			next := spec.Next(now)
			setNext(&st, &next)
		}
		out = append(out, st)
	}
	return out
}

// setNext sets the next tick, in the state's zone and in UTC.
func setNext(s *delayqtype.ScheduleState, next *time.Time) {
	if next == nil || next.IsZero() {
		return
	}
	loc, err := time.LoadLocation(s.TimeZone)
	if err != nil {
		loc = time.UTC
	}
	local, utc := next.In(loc), next.UTC()
	s.NextTick, s.NextTickUTC = &local, &utc
}
