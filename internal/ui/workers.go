package ui

import (
	"net/http"
	"sort"
	"strconv"
	"time"

	"github.com/delayq/delayq/delayqtype"
)

// --- workers ---

// workerRow is one worker process, with its durations on the Redis clock.
type workerRow struct {
	delayqtype.Worker
	Up, SinceBeat time.Duration
	QueueList     []queueConcurrency
}

type queueConcurrency struct {
	Queue       string
	Concurrency int
}

// runRow is one run in flight.
type runRow struct {
	Worker    string // its process's id
	Host      string
	Queue, ID string
	Attempt   int
	For       time.Duration
	Lost      bool // its process is lost: the run may be over
	ClaimedAt time.Time
}

type workersData struct {
	Workers              []workerRow
	Runs                 []runRow
	Live, Lost, InFlight int
	Unlisted             int // runs in flight that the records do not list (over 100 a process)
}

// workersPage lists the worker processes from their heartbeats in Redis
// (dispatch's Workers) and the runs each has in flight.
func (h *Handler) workersPage(w http.ResponseWriter, r *http.Request, p *page) {
	ctx, cancel := ctxOf(r)
	defer cancel()
	ws, err := h.cfg.Redis.Workers(ctx)
	if err != nil {
		h.fail(w, p, http.StatusBadGateway, err)
		return
	}
	var d workersData
	for _, x := range ws {
		row := workerRow{Worker: x, Up: x.ReadAt.Sub(x.Started), SinceBeat: x.ReadAt.Sub(x.LastBeat)}
		for q, n := range x.Queues {
			row.QueueList = append(row.QueueList, queueConcurrency{q, n})
		}
		sort.Slice(row.QueueList, func(i, j int) bool { return row.QueueList[i].Queue < row.QueueList[j].Queue })
		d.Workers = append(d.Workers, row)
		if x.Lost {
			d.Lost++
		} else {
			d.Live++
		}
		d.InFlight += x.InFlight
		d.Unlisted += max(0, x.InFlight-len(x.Running))
		for _, run := range x.Running {
			d.Runs = append(d.Runs, runRow{Worker: x.ID, Host: x.Host, Queue: run.Queue, ID: run.ID, Attempt: run.Attempt,
				For: x.ReadAt.Sub(run.ClaimedAt), Lost: x.Lost, ClaimedAt: run.ClaimedAt})
		}
	}
	sort.SliceStable(d.Runs, func(i, j int) bool { return d.Runs[i].For > d.Runs[j].For })
	p.Title = "Workers"
	p.Refresh = int(h.cfg.Refresh / time.Second)
	if v, err := strconv.Atoi(r.URL.Query().Get("refresh")); err == nil && v >= 0 && v <= 3600 {
		p.Refresh = v
	}
	h.render(w, p, "workers", d)
}
