package delayqtype

import "time"

// ScheduleState is one periodic schedule (package schedule) as the database
// holds it, or as it is declared when no process ran it yet (UpdatedAt zero).
type ScheduleState struct {
	Name  string `json:"name"`
	Queue string `json:"queue"`
	// Spec describes the timing: "cron 0 3 * * * (Europe/Paris)", "every 30s".
	Spec string `json:"spec"`
	// TimeZone is the IANA zone the schedule's cron expression is read in
	// ("UTC" for an interval or a cron expression without one).
	TimeZone string `json:"time_zone"`
	// LastTick is the time of the last tick enqueued (ticks are enqueued a
	// little before they fall due); nil before the first.
	LastTick *time.Time `json:"last_tick"`
	// NextTick is the next tick to enqueue, in TimeZone; NextTickUTC the same
	// instant in UTC. Nil: none within five years.
	NextTick    *time.Time `json:"next_tick"`
	NextTickUTC *time.Time `json:"next_tick_utc"`
	// Enqueued counts the ticks enqueued, Missed those dropped by the
	// schedule's missed-tick policy.
	Enqueued int64 `json:"enqueued"`
	Missed   int64 `json:"missed"`
	// UpdatedAt is when a process running the schedule last evaluated it; zero
	// when none did yet.
	UpdatedAt time.Time `json:"updated_at"`
	// Paused reports a schedule an operator paused (`delayq schedules pause`,
	// the dashboard), since PausedAt: no process enqueues its ticks, which are
	// counted in Missed, until it is resumed; NextTick is then the next tick
	// it would run.
	Paused   bool       `json:"paused"`
	PausedAt *time.Time `json:"paused_at"`
	// LastRunID is the task id of the last manual run of the schedule
	// (`delayq schedules run`, the dashboard's run now), in Queue, enqueued
	// at LastRunAt; empty before the first.
	LastRunID string     `json:"last_run_id"`
	LastRunAt *time.Time `json:"last_run_at"`
}
