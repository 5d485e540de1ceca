package ui

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/delayq/delayq/delayqtype"
	"github.com/delayq/delayq/internal/schedrun"
	"github.com/delayq/delayq/internal/schedspec"
	"github.com/delayq/delayq/internal/taskstate"
	"github.com/delayq/delayq/internal/validate"
)

// --- schedules ---

// scheduleRow is one schedule with the task of its last tick, when one is
// still in the outbox (the retention prunes finished rows).
type scheduleRow struct {
	delayqtype.ScheduleState
	LastTask *taskstate.TaskRow
	// LastRun is the task of the last manual run, when still in the outbox;
	// RunKey the key of this page's run-now form (schedspec.NewRunKey).
	LastRun *taskstate.TaskRow
	RunKey  string
}

// schedulesPage lists the periodic schedules as the database holds them (every
// relay's and worker's, declared in YAML or in Go): timing, zone, the next tick
// in the zone and in UTC, the last tick with its task's outcome, the ticks
// enqueued and missed.
func (h *Handler) schedulesPage(w http.ResponseWriter, r *http.Request, p *page) {
	ctx, cancel := ctxOf(r)
	defer cancel()
	states, err := h.scheduleStates(ctx)
	if err != nil {
		h.fail(w, p, http.StatusInternalServerError, err)
		return
	}
	rows := make([]scheduleRow, 0, len(states))
	for _, s := range states {
		row := scheduleRow{ScheduleState: s}
		if s.LastTick != nil {
			// A tick's task id is the name and the tick's time, in milliseconds
			// for an interval with a fraction of a second (schedule.TaskID): one
			// of the two ids, looked up by the unique key.
			for _, millis := range []bool{false, true} {
				t, ok, err := h.browse.Task(ctx, h.cfg.DB, s.Queue, s.Name+"@"+validate.TimeID(*s.LastTick, millis), 0)
				if err != nil {
					h.fail(w, p, http.StatusInternalServerError, err)
					return
				}
				if ok {
					row.LastTask = &t
					break
				}
			}
		}
		if s.LastRunID != "" {
			t, ok, err := h.browse.Task(ctx, h.cfg.DB, s.Queue, s.LastRunID, 0)
			if err != nil {
				h.fail(w, p, http.StatusInternalServerError, err)
				return
			}
			if ok {
				row.LastRun = &t
			}
		}
		if p.CanAct {
			row.RunKey = schedspec.NewRunKey(time.Now())
		}
		rows = append(rows, row)
	}
	p.Title = "Schedules"
	h.render(w, p, "schedules", struct {
		Schedules []scheduleRow
		Now       time.Time
	}{rows, time.Now()})
}

// scheduleStates lists the schedules: the database's, and those declared in
// this process that no runner ran yet when Config.Schedules says.
func (h *Handler) scheduleStates(ctx context.Context) ([]delayqtype.ScheduleState, error) {
	if h.cfg.Schedules != nil {
		return h.cfg.Schedules(ctx)
	}
	return schedrun.List(ctx, h.cfg.DB, h.opts.Schema, nil)
}

// --- schedule actions ---

// maxRunKeyAge is how old a run-now form may be: its key's time is the tick's
// time the task's id carries (schedule.ParseTaskID), so a page left open for
// hours must be reloaded rather than run a tick of then.
const maxRunKeyAge = 15 * time.Minute

// scheduleName reads and validates the form's schedule name.
func scheduleName(r *http.Request) (string, error) {
	name := r.PostForm.Get("schedule")
	if err := validate.Queue(name); err != nil {
		return "", fmt.Errorf("schedule name %q: 1..64 bytes of [A-Za-z0-9_.-]", name)
	}
	return name, nil
}

func scheduleStatus(err error) int {
	switch {
	case errors.Is(err, schedrun.ErrNotFound):
		return http.StatusNotFound
	case errors.Is(err, schedrun.ErrNoPayload):
		return http.StatusConflict
	case errors.Is(err, schedrun.ErrRunKey):
		return http.StatusBadRequest
	}
	return http.StatusBadGateway
}

// actSchedulePause pauses or resumes a schedule as delayq schedules pause does:
// one transaction on its row, which every runner reads at its next evaluation.
func (h *Handler) actSchedulePause(pause bool) func(http.ResponseWriter, *http.Request, *page) {
	return func(w http.ResponseWriter, r *http.Request, p *page) {
		name, err := scheduleName(r)
		if err != nil {
			h.fail(w, p, http.StatusBadRequest, err)
			return
		}
		ctx, cancel := ctxOf(r)
		defer cancel()
		ok := "schedule-paused"
		if pause {
			// A schedule declared here and not run yet is registered paused.
			var declared []schedrun.ScheduleDecl
			if h.cfg.Schedules != nil {
				states, lerr := h.cfg.Schedules(ctx)
				if lerr != nil {
					h.fail(w, p, http.StatusBadGateway, lerr)
					return
				}
				declared = schedrun.DeclaredStates(states)
			}
			_, err = h.sched.Pause(ctx, h.cfg.DB, name, declared)
		} else {
			_, err = h.sched.Resume(ctx, h.cfg.DB, name)
			ok = "schedule-resumed"
		}
		if err != nil {
			h.fail(w, p, scheduleStatus(err), err)
			return
		}
		h.done(w, r, h.cfg.BasePath+"/schedules", ok)
	}
}

// actScheduleRun enqueues one tick of a schedule now, with the run key of the
// form: the same form sent twice (a double click, a retry after a timeout) names
// the same task, enqueued once.
func (h *Handler) actScheduleRun(w http.ResponseWriter, r *http.Request, p *page) {
	name, err := scheduleName(r)
	if err != nil {
		h.fail(w, p, http.StatusBadRequest, err)
		return
	}
	key := r.PostForm.Get("run")
	asked, err := schedspec.ParseRunKey(key)
	if err != nil {
		h.fail(w, p, http.StatusBadRequest, err)
		return
	}
	if age := time.Since(asked); age > maxRunKeyAge || age < -time.Minute {
		h.fail(w, p, http.StatusConflict, fmt.Errorf("this page was loaded %s ago: reload it and run the schedule again (nothing was done)", short(age.Round(time.Second))))
		return
	}
	ctx, cancel := ctxOf(r)
	defer cancel()
	run, err := h.sched.RunNow(ctx, h.cfg.DB, name, key, nil)
	if err != nil {
		h.fail(w, p, scheduleStatus(err), err)
		return
	}
	ok := "schedule-run"
	if run.Duplicate {
		ok = "schedule-run-dup"
	}
	h.done(w, r, h.cfg.BasePath+"/schedules", ok)
}
