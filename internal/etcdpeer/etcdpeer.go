// Package etcdpeer runs the YCSB driver against etcd through its official Go
// client, the peer Terroir's single-region figures are compared with: every
// operation is one linearizable etcd request or transaction, each commit
// fsync'd by a majority of members as Terroir's are.
package etcdpeer

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/terroir-db/terroir/internal/ycsb"
)

// Store is a ycsb.Store over an etcd cluster.
type Store struct {
	cli     *clientv3.Client
	retries atomic.Int64
}

// ParseTarget returns the endpoints of an "etcd://host:port,host:port" target.
func ParseTarget(target string) ([]string, error) {
	rest, ok := strings.CutPrefix(target, "etcd://")
	if !ok || rest == "" {
		return nil, fmt.Errorf("etcdpeer: target %q is not etcd://host:port[,host:port...]", target)
	}
	return strings.Split(rest, ","), nil
}

// Open connects to the etcd members at endpoints (host:port), waiting up to
// 5 s for one to answer.
func Open(ctx context.Context, endpoints []string) (*Store, error) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return nil, fmt.Errorf("etcdpeer: %w", err)
	}
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := cli.Status(sctx, endpoints[0]); err != nil {
		cli.Close()
		return nil, fmt.Errorf("etcdpeer: %s does not answer: %w", endpoints[0], err)
	}
	return &Store{cli: cli}, nil
}

// Close closes the client.
func (s *Store) Close() error { return s.cli.Close() }

var _ ycsb.Store = (*Store)(nil)

// Read is a linearizable Get.
func (s *Store) Read(ctx context.Context, key []byte) error {
	_, err := s.cli.Get(ctx, string(key))
	return err
}

// Write is a Put.
func (s *Store) Write(ctx context.Context, key, value []byte) error {
	_, err := s.cli.Put(ctx, string(key), string(value))
	return err
}

// Scan is a linearizable range Get of up to n keys in [start, end).
func (s *Store) Scan(ctx context.Context, start, end []byte, n int) error {
	_, err := s.cli.Get(ctx, string(start), clientv3.WithRange(string(end)), clientv3.WithLimit(int64(n)))
	return err
}

// ReadModifyWrite reads key, then writes it in a transaction that commits
// only if key's revision is unchanged, retrying otherwise (etcd's optimistic
// concurrency, as its STM does).
func (s *Store) ReadModifyWrite(ctx context.Context, key, value []byte) error {
	for attempt := 0; ; attempt++ {
		if attempt > 0 {
			s.retries.Add(1)
		}
		got, err := s.cli.Get(ctx, string(key))
		if err != nil {
			return err
		}
		var rev int64
		if len(got.Kvs) > 0 {
			rev = got.Kvs[0].ModRevision
		}
		resp, err := s.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(string(key)), "=", rev)).
			Then(clientv3.OpPut(string(key), string(value))).Commit()
		if err != nil {
			return err
		}
		if resp.Succeeded {
			return nil
		}
	}
}

// Load writes the records in one transaction.
func (s *Store) Load(ctx context.Context, keys, values [][]byte) error {
	ops := make([]clientv3.Op, len(keys))
	for i := range keys {
		ops[i] = clientv3.OpPut(string(keys[i]), string(values[i]))
	}
	_, err := s.cli.Txn(ctx).Then(ops...).Commit()
	return err
}

// Retries returns how many read-modify-writes ran again after a conflict.
func (s *Store) Retries() int64 { return s.retries.Load() }
