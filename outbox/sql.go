package outbox

import "context"

// runner runs the statements on either side: pgx or database/sql.
type runner interface {
	// query runs sql and calls each for every row, with the row's Scan.
	query(ctx context.Context, sql string, args []any, each func(scan func(dest ...any) error) error) error
	// exec runs sql and returns the number of rows it affected.
	exec(ctx context.Context, sql string, args []any) (int64, error)
}

type pgxRunner struct{ q Querier }

func (r pgxRunner) query(ctx context.Context, sql string, args []any, each func(func(...any) error) error) error {
	rows, err := r.q.Query(ctx, sql, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		if err := each(rows.Scan); err != nil {
			return err
		}
	}
	return rows.Err()
}

func (r pgxRunner) exec(ctx context.Context, sql string, args []any) (int64, error) {
	tag, err := r.q.Exec(ctx, sql, args...)
	if err != nil {
		return 0, err
	}
	return tag.RowsAffected(), nil
}

type sqlRunner struct{ q SQLQuerier }

func (r sqlRunner) query(ctx context.Context, sql string, args []any, each func(func(...any) error) error) error {
	rows, err := r.q.QueryContext(ctx, sql, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		if err := each(rows.Scan); err != nil {
			return err
		}
	}
	if err := rows.Err(); err != nil {
		return err
	}
	return rows.Close()
}

func (r sqlRunner) exec(ctx context.Context, sql string, args []any) (int64, error) {
	res, err := r.q.ExecContext(ctx, sql, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}
