package ui

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"

	"github.com/delayq/delayq/internal/taskstate"
)

// The task page's dependencies, dependents, stored result and workflow (issue
// 33, item 7). delayq_deps holds only the edges still waiting (each is
// deleted as it settles), so the page shows the dependencies a task still
// waits on and the dependents still waiting on it; the workflow is the tasks
// those edges connect, walked either way.

const (
	// linksShown bounds the dependencies and dependents listed (a task waits
	// on at most 100; a task may have any number of dependents).
	linksShown = 100
	// dependentsCounted bounds the count of dependents.
	dependentsCounted = 10000
	// workflowBound bounds the tasks of the workflow walked.
	workflowBound = 500
)

// workflowData is what the task page shows of a task's workflow.
type workflowData struct {
	// Shown: the task is or was part of a workflow (it waits, or tasks were
	// enqueued waiting on it), so the section is drawn.
	Shown    bool
	WaitsFor int
	Deps     []taskstate.Link
	// Dependents are the first linksShown of DependentsN (counted up to
	// dependentsCounted: DependentsMore when there are that many or more).
	Dependents     []taskstate.Link
	DependentsN    int
	DependentsMore bool
	Flow           taskstate.Workflow
	FlowBound      int
	// Err says why a part is missing (the time limit), the rest shown.
	Err string
	// Batch: the task is a batch's callback (workflow.Client.Batch); its
	// children's counts, one row read on its key.
	Batch *taskstate.BatchCounts

	// HasResult: a result is stored; Result is its text (or hex dump), "" when
	// payloads are hidden; ResultKind json, text or binary.
	HasResult       bool
	Result          string
	ResultKind      string
	ResultBytes     int
	ResultTruncated bool
}

// MoreDependents is how many dependents are not listed.
func (w workflowData) MoreDependents() int { return w.DependentsN - len(w.Dependents) }

// loadWorkflow reads the workflow part of row's page: its stored result from
// the row, and, for a task that waits or has dependents, its edges, under the
// dashboard's time limit (delayq_deps has no index on a dependent's key).
func (h *Handler) loadWorkflow(ctx context.Context, row taskstate.TaskRow) workflowData {
	w := workflowData{WaitsFor: row.WaitsFor, FlowBound: workflowBound}
	if row.Result != nil {
		w.HasResult, w.ResultBytes = true, row.ResultBytes
		if !h.cfg.HidePayloads {
			w.ResultTruncated = row.ResultBytes > len(row.Result)
			w.Result, w.ResultKind = showPayload(row.Result, w.ResultTruncated)
		}
	}
	if b, ok, err := h.deps.Batch(ctx, h.cfg.DB, row.Queue, row.ID); err != nil {
		w.Err = err.Error()
	} else if ok {
		w.Batch = &b
	}
	if row.State != taskstate.Waiting && !row.HasDependents {
		return w
	}
	w.Shown = true
	err := h.bounded(ctx, func(tx pgx.Tx) (err error) {
		if row.State == taskstate.Waiting {
			if w.Deps, err = h.deps.Dependencies(ctx, tx, row.Queue, row.ID, linksShown); err != nil {
				return err
			}
		}
		if w.Dependents, w.DependentsN, err = h.deps.Dependents(ctx, tx, row.Queue, row.ID, linksShown, dependentsCounted); err != nil {
			return err
		}
		w.DependentsMore = w.DependentsN >= dependentsCounted
		w.Flow, err = h.deps.Workflow(ctx, tx, h.browse, row.Queue, row.ID, workflowBound)
		return err
	})
	switch {
	case errors.Is(err, errTooLong):
		w.Err = "The dependencies were not all read: " + err.Error()
	case err != nil:
		w.Err = err.Error()
	}
	return w
}
