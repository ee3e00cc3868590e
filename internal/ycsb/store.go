package ycsb

import (
	"context"

	"github.com/terroir-db/terroir/client"
)

// Store is what the driver runs operations against: each call is one
// transaction, retried inside as the store requires.
type Store interface {
	// Read reads key.
	Read(ctx context.Context, key []byte) error
	// Write writes key = value (an update, or an insert).
	Write(ctx context.Context, key, value []byte) error
	// Scan reads up to n records from start, below end.
	Scan(ctx context.Context, start, end []byte, n int) error
	// ReadModifyWrite reads key and writes it in one transaction.
	ReadModifyWrite(ctx context.Context, key, value []byte) error
	// Load writes the records in as few transactions as the store allows.
	Load(ctx context.Context, keys, values [][]byte) error
	// Retries returns how many attempts ran again after a conflict so far.
	Retries() int64
}

// Terroir returns the Store of a Terroir client: every operation is one
// strictly serializable transaction. A read or a write of one record is a
// transaction of its own in one round trip (client.DB.Get, client.DB.Put),
// as etcd's driver sends one request; scans, read-modify-writes and loads
// run in client.DB.Update.
func Terroir(db *client.DB) Store { return &terroirStore{db: db, since: db.Retries()} }

type terroirStore struct {
	db    *client.DB
	since int64 // the DB's retries before the store was made
}

// update runs fn in a transaction (client.DB.Update retries it).
func (s *terroirStore) update(ctx context.Context, fn func(ctx context.Context, tx *client.Txn) error) error {
	return s.db.Update(ctx, fn)
}

func (s *terroirStore) Read(ctx context.Context, key []byte) error {
	_, _, err := s.db.Get(ctx, key)
	return err
}

func (s *terroirStore) Write(ctx context.Context, key, value []byte) error {
	_, err := s.db.Put(ctx, key, value)
	return err
}

func (s *terroirStore) Scan(ctx context.Context, start, end []byte, n int) error {
	return s.update(ctx, func(ctx context.Context, tx *client.Txn) error {
		_, err := tx.Scan(ctx, start, end, n)
		return err
	})
}

func (s *terroirStore) ReadModifyWrite(ctx context.Context, key, value []byte) error {
	return s.update(ctx, func(ctx context.Context, tx *client.Txn) error {
		if _, _, err := tx.Get(ctx, key); err != nil {
			return err
		}
		return tx.Put(ctx, key, value)
	})
}

func (s *terroirStore) Load(ctx context.Context, keys, values [][]byte) error {
	return s.update(ctx, func(ctx context.Context, tx *client.Txn) error {
		for i := range keys {
			if err := tx.Put(ctx, keys[i], values[i]); err != nil {
				return err
			}
		}
		return nil
	})
}

// Retries counts the DB's retried transactions since the store was made.
func (s *terroirStore) Retries() int64 { return s.db.Retries() - s.since }
