package client

import "context"

// ClosedChanges reads the changes of [lo, hi) in [since, at) from the
// ranges' closed epochs (as a changefeed round does), for tests.
func (db *DB) ClosedChanges(ctx context.Context, lo, hi []byte, since, at uint64) ([]Change, error) {
	s := db.coord.ClosedSnapshot(at)
	defer s.Finish()
	return s.Changes(ctx, lo, hi, since, false, 0)
}
