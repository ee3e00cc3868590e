// Package rangeserver is the KV service of one range (paper §2.3, DESIGN.md §2,
// §3.3–§3.5, §4, §10–§11): the replicated state machine every replica
// applies, and the leader that serves locking reads and writes, takes part in
// two-phase commit, serves snapshot reads, and resolves transactions whose
// coordinator went silent. One file per job:
//
//   - statemachine.go: the replicated state — the descriptor, lease and
//     prepared records under the range's id, the MVCC data under the user
//     key — and its commands, snapshots and reads (Get, Scan, Size, MidKey).
//   - reshape.go: the commands that change the range's shape, as every
//     replica applies them: split, subsume, merge.
//   - replica.go: a replica, its configuration and errors, and the gate every
//     leader operation passes (leader, propose).
//   - lease.go: acquiring, renewing and queueing leases (nextLease), and a
//     leadership's life: activation with the prepared transactions re-locked,
//     stepping down.
//   - txnrecords.go: the leader's records of the transactions holding locks,
//     with their lock table (txnTable): incarnations, heartbeats, lock waits,
//     the orphan decision.
//   - locking.go: locking reads and writes (Get, Scan, Lock) and heartbeats.
//   - commit.go: participant commit — Prepare, Commit, Abort, one-phase
//     commit — by the rules of package commitrule.
//   - orphans.go: resolving orphans through the transaction state store.
//   - snapshotread.go: lock-free snapshot reads (paper §5.2, Algorithm 1),
//     at the leader or, at epochs up to the closed epoch + 1, at any replica.
//   - closed.go: closed epochs (DESIGN.md §13): the leader's closing, the
//     replicated ClosedEpoch command, reads served from it.
//   - sideclosed.go: an idle range's closes sent outside its log, and when
//     a replica trusts them; sidetransport.go: one RPC per peer node for
//     all of a node's ranges.
//   - gc.go: MVCC garbage collection on the leader's schedule (DESIGN.md §14).
//   - split.go: splits, by an operator (AdminSplit) or automatically by size
//     or load, and what the leader does when one applies.
//   - merge.go: merges, by an operator (AdminMerge) or automatically of
//     small, cold neighbours: subsuming the right-hand range, absorbing it.
//   - load.go: the leader's request rate and the key that divides its load.
//   - server.go: the gRPC service and its error mapping.
//
// The leader reads time only through Config.Clock, and data only through the
// state machine's Get and Scan.
package rangeserver
