package epoch

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/terroir-db/terroir/internal/epoch/epochpb"
	"github.com/terroir-db/terroir/internal/topology"
)

// fakeNodes answers a pair of Readers' requests in place of the replicas
// of several groups on nodes 1–3: each group's epoch, the same at every
// node, a group a node fails for (NotFound), or a node that serves no
// ReadEpochs (Unimplemented). It counts each node's RPCs of each kind.
type fakeNodes struct {
	mu      sync.Mutex
	epochs  map[uint64]uint64         // by group
	missing map[[2]uint64]bool        // {node, group}: the node fails that group's reads
	old     map[uint64]bool           // nodes without ReadEpochs
	refused map[[2]uint64]bool        // {node, group}: the node refuses the group (Unavailable: a lapsed publisher)
	refusal chan struct{}             // gets a value when a replica refuses
	single  map[uint64]int            // ReadEpoch RPCs, by node
	many    map[uint64]int            // ReadEpochs RPCs, by node
	carried map[uint64]map[uint64]int // reads a ReadEpochs carried, by node and group
}

func newFakeNodes(epochs map[uint64]uint64) *fakeNodes {
	return &fakeNodes{epochs: epochs, missing: map[[2]uint64]bool{}, old: map[uint64]bool{}, refused: map[[2]uint64]bool{}, refusal: make(chan struct{}, 1),
		single: map[uint64]int{}, many: map[uint64]int{}, carried: map[uint64]map[uint64]int{}}
}

func (f *fakeNodes) answer(ctx context.Context, node uint64, req *epochpb.ReadEpochRequest) (*epochpb.ReadEpochResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.refused[[2]uint64{node, req.GetGroupId()}] {
		select {
		case f.refusal <- struct{}{}:
		default:
		}
		return nil, status.Errorf(codes.Unavailable, "publisher %d: no global epoch update", req.GetGroupId())
	}
	if f.missing[[2]uint64{node, req.GetGroupId()}] {
		return nil, status.Errorf(codes.NotFound, "epoch group %d is not hosted here", req.GetGroupId())
	}
	return &epochpb.ReadEpochResponse{Epoch: f.epochs[req.GetGroupId()], ReplicaId: node}, nil
}

func (f *fakeNodes) call(ctx context.Context, node uint64, req *epochpb.ReadEpochRequest) (*epochpb.ReadEpochResponse, error) {
	f.mu.Lock()
	f.single[node]++
	f.mu.Unlock()
	return f.answer(ctx, node, req)
}

func (f *fakeNodes) callMany(ctx context.Context, node uint64, reqs []*epochpb.ReadEpochRequest) (*epochpb.ReadEpochsResponse, error) {
	f.mu.Lock()
	if f.old[node] {
		f.mu.Unlock()
		return nil, status.Error(codes.Unimplemented, "unknown method ReadEpochs")
	}
	f.many[node]++
	if f.carried[node] == nil {
		f.carried[node] = map[uint64]int{}
	}
	for _, req := range reqs {
		f.carried[node][req.GetGroupId()]++
	}
	f.mu.Unlock()
	out := &epochpb.ReadEpochsResponse{}
	for _, req := range reqs {
		resp, err := f.answer(ctx, node, req)
		st := status.Convert(err)
		out.Results = append(out.Results, &epochpb.EpochResult{Response: resp, Code: uint32(st.Code()), Message: st.Message()})
	}
	return out, nil
}

// settle waits, at most a second, until the other nodes have got want
// RPCs in all: an ask the read it served no longer waited for may still be
// on its way when the read returns.
func (f *fakeNodes) settle(want int) {
	total := func() int {
		f.mu.Lock()
		defer f.mu.Unlock()
		n := 0
		for _, m := range []map[uint64]int{f.single, f.many} {
			for _, c := range m {
				n += c
			}
		}
		return n
	}
	for deadline := time.Now().Add(time.Second); total() < want && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
}

// counts returns the RPCs to the other nodes (2 and 3) so far, of each
// kind, and forgets them and the reads carried.
func (f *fakeNodes) counts() (single, many map[uint64]int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	single, many = f.single, f.many
	f.single, f.many, f.carried = map[uint64]int{}, map[uint64]int{}, map[uint64]map[uint64]int{}
	return single, many
}

// fakePair is a local epoch Reader (group 1) paired with a publisher's
// (group 2), both groups on nodes 1–3 and both readers on node 1, whose
// replica answers in process; f answers the other nodes.
func fakePair(t *testing.T, f *fakeNodes) (local, pub *Reader) {
	mk := func(group uint64) *Reader {
		r := NewReader(nil, topology.Group{ID: group, Region: "r", Replicas: []uint64{1, 2, 3}})
		r.call, r.callMany = f.call, f.callMany
		r.ServeLocally(1, func(ctx context.Context, req *epochpb.ReadEpochRequest) (*epochpb.ReadEpochResponse, error) {
			return f.answer(ctx, 1, req)
		})
		r.demandEvery = time.Hour // only the first read asks every voter (demandDue)
		t.Cleanup(r.Close)
		return r
	}
	local, pub = mk(1), mk(2)
	local.Pair(pub)
	return local, pub
}

// hedges returns the hedges (Stats) the readers made so far, in all.
func hedges(readers ...*Reader) int {
	n := 0
	for _, r := range readers {
		h := r.Stats().Hedges
		n += int(h)
	}
	return n
}

// TestPairedReadsShareOneRPC: StartAll of a paired local epoch and
// publisher (a range leader's commit) reads both groups' epochs with one
// ReadEpochs RPC to one other node, where unpaired it sent a ReadEpoch per
// group (issue 17), even when the two readers last agreed with different
// nodes: the publisher's first ask is led to the node the local epoch
// asks. It fails without the pairing in StartAll ("ReadEpoch RPCs
// map[2:20 3:20]") or without the lead ("ReadEpochs RPCs map[2:20], and
// ReadEpoch map[3:20]").
func TestPairedReadsShareOneRPC(t *testing.T) {
	f := newFakeNodes(map[uint64]uint64{1: 50, 2: 70})
	local, pub := fakePair(t, f)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	read := func() {
		t.Helper()
		got, err := StartAll(ctx, local, pub)()
		if err != nil || got[0] != 50 || got[1] != 70 {
			t.Fatalf("paired read %v, %v; want [50 70]", got, err)
		}
	}
	read() // the first asks every voter (demandDue): nodes 2 and 3
	f.settle(2)
	f.counts()
	local.preferred.Store(2)
	pub.preferred.Store(3) // the readers last agreed with different nodes
	before := hedges(local, pub)
	const reads = 20
	for i := 0; i < reads; i++ {
		read()
	}
	// A reader whose joint reply took over hedgeAfter (at least 1 ms: a loaded
	// machine's scheduling delay, as under -race in CI) asked its group's
	// third voter too, on its own, as it should: a ReadEpoch per hedge.
	// If the third answered first, the readers prefer it from then on
	// (and the hedges go to node 2). Beyond those, nothing.
	hedged := hedges(local, pub) - before
	f.settle(reads + hedged)
	single, many := f.counts()
	sum := func(m map[uint64]int) int { return m[2] + m[3] }
	if sum(many) != reads || sum(single) != hedged || hedged > reads/4 || (hedged == 0 && many[2] != reads) {
		t.Fatalf("%d paired reads, %d hedges: ReadEpochs RPCs %v, and ReadEpoch %v; want %d ReadEpochs (to node 2 unless a hedge found node 3 first), a ReadEpoch per hedge, and few hedges", reads, hedged, many, single, reads)
	}
	// Unpaired sources read as before: a ReadEpoch each.
	if got, err := StartAll(ctx, pub, local)(); err != nil || got[0] != 70 || got[1] != 50 {
		t.Fatalf("unpaired order: read %v, %v; want [70 50]", got, err)
	}
	if single, many := f.counts(); len(many) != 0 || single[2]+single[3] != 2 {
		t.Fatalf("unpaired reads: ReadEpochs %v, ReadEpoch %v; want two ReadEpoch", many, single)
	}
}

// TestPairedReadsSurviveFailedParts: a node that fails one group's read
// in a ReadEpochs (NotFound: its replica moved away) costs that group a
// hedge to the third node, not the other group's read; a node that
// serves no ReadEpochs (Unimplemented: one that predates it) is asked
// with a ReadEpoch per group. Both reads still return the majority's
// epochs. It fails if a part's error is not its reply's ("replies (50,
// <nil>) and (0, <nil>)"), or if an old node is not asked again per group
// ("ReadEpoch map[3:2]": the reads went on only by hedging).
func TestPairedReadsSurviveFailedParts(t *testing.T) {
	f := newFakeNodes(map[uint64]uint64{1: 50, 2: 70})
	local, pub := fakePair(t, f)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	read := func(what string) {
		t.Helper()
		got, err := StartAll(ctx, local, pub)()
		if err != nil || got[0] != 50 || got[1] != 70 {
			t.Fatalf("%s: paired read %v, %v; want [50 70]", what, got, err)
		}
	}
	read("warm-up") // asks every voter (demandDue): nodes 2 and 3
	f.settle(2)
	f.counts()
	local.preferred.Store(2)
	pub.preferred.Store(2)
	f.mu.Lock()
	f.missing[[2]uint64{2, 2}] = true // node 2 no longer hosts the publisher
	f.mu.Unlock()
	localBefore, pubBefore := hedges(local), hedges(pub)
	read("node 2 fails the publisher")
	// The publisher's failed part is its hedge; the local epoch hedges
	// only when its reply took over hedgeAfter (a loaded machine), and
	// then asks node 3 too.
	localHedged, pubHedged := hedges(local)-localBefore, hedges(pub)-pubBefore
	f.settle(2 + localHedged)
	single, many := f.counts()
	if many[2] != 1 || pubHedged != 1 || single[3] != 1+localHedged {
		t.Fatalf("node 2 failing one group: ReadEpochs %v, ReadEpoch %v, hedges %d (local epoch) and %d (publisher); want one ReadEpochs to node 2 and the publisher's ReadEpoch to node 3, and one more per local hedge", many, single, localHedged, pubHedged)
	}
	// Each part's reply is its own: the epoch, or the part's error.
	mine, theirs := make(chan reply, 1), make(chan reply, 1)
	local.ask(askJob{ctx: ctx, node: 2, parts: []askPart{
		{req: &epochpb.ReadEpochRequest{GroupId: 1}, replies: mine, boot: local.boot},
		{req: &epochpb.ReadEpochRequest{GroupId: 2}, replies: theirs, boot: pub.boot}}})
	if a, b := <-mine, <-theirs; a.err != nil || a.epoch != 50 || status.Code(b.err) != codes.NotFound {
		t.Fatalf("one ReadEpochs to node 2: replies (%d, %v) and (%d, %v); want (50, nil) and NotFound", a.epoch, a.err, b.epoch, b.err)
	}
	f.mu.Lock()
	f.missing = map[[2]uint64]bool{}
	f.old[2], f.old[3] = true, true
	f.mu.Unlock()
	f.counts()
	read("old nodes")
	if single, many := f.counts(); len(many) != 0 || single[2] != 2 {
		t.Fatalf("old nodes: ReadEpochs %v, ReadEpoch %v; want node 2 asked with a ReadEpoch per group", many, single)
	}
}

// TestAnUnavailablePartnerHoldsUpNoOwnRead: while a joint round's
// publisher read cannot decide (two of its three replicas refuse, as a
// publisher whose lease lapsed does, until the round times out: the third
// alone is no majority), reads of the local
// epoch alone (a leaseholder renewing its lease) still return at once, in
// later rounds, before the joint read gives up; the joint read then
// returns the local epoch and the publisher's error. It fails if the
// partner's read holds up the round loop ("the joint read returned before
// the local epoch's own reads").
func TestAnUnavailablePartnerHoldsUpNoOwnRead(t *testing.T) {
	f := newFakeNodes(map[uint64]uint64{1: 50, 2: 70})
	local, pub := fakePair(t, f)
	local.timeout = time.Second
	f.mu.Lock()
	f.refused[[2]uint64{2, 2}], f.refused[[2]uint64{3, 2}] = true, true
	f.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	type result struct {
		got []uint64
		err error
	}
	joint := make(chan result, 1)
	go func() {
		got, err := StartAll(ctx, local, pub)()
		joint <- result{got, err}
	}()
	select {
	case <-f.refusal:
	case <-ctx.Done():
		t.Fatal("the joint round never asked for the publisher")
	}
	for i := 0; i < 10; i++ {
		if e, err := local.ReadBackground(ctx); err != nil || e != 50 {
			t.Fatalf("own read %d: %d, %v; want 50", i, e, err)
		}
	}
	select {
	case res := <-joint:
		t.Fatalf("the joint read returned before the local epoch's own reads: %v, %v", res.got, res.err)
	default:
	}
	res := <-joint
	if res.got[0] != 50 || !errors.Is(res.err, ErrUnavailable) {
		t.Fatalf("joint read with the publisher silent: %v, %v; want local epoch 50 and ErrUnavailable", res.got, res.err)
	}
}

// TestResultOfNamesEveryFailure: a ReadEpochs result is the call's error
// when it failed, Internal when the node answered fewer reads than asked
// or an OK result without a response (never an epoch 0 read as agreed),
// and the node's result otherwise.
func TestResultOfNamesEveryFailure(t *testing.T) {
	ok := &epochpb.EpochResult{Response: &epochpb.ReadEpochResponse{Epoch: 9}}
	resp := &epochpb.ReadEpochsResponse{Results: []*epochpb.EpochResult{ok, {}}}
	for _, tc := range []struct {
		name string
		resp *epochpb.ReadEpochsResponse
		err  error
		i    int
		code codes.Code
	}{
		{"the call failed", nil, status.Error(codes.Unavailable, "down"), 0, codes.Unavailable},
		{"answered", resp, nil, 0, codes.OK},
		{"OK without a response", resp, nil, 1, codes.Internal},
		{"too few results", resp, nil, 2, codes.Internal},
	} {
		got := resultOf(tc.resp, tc.i, tc.err)
		if codes.Code(got.GetCode()) != tc.code || (tc.code == codes.OK && got.GetResponse().GetEpoch() != 9) {
			t.Errorf("%s: result %v, want code %v", tc.name, got, tc.code)
		}
	}
}
