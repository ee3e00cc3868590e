package epoch

// How a Reader asks a node: one asker goroutine per node, one job per
// node an attempt asks, one RPC per job whatever the groups it carries.

import (
	"context"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/terroir-db/terroir/internal/epoch/epochpb"
)

// askJob is what one node is asked, in an attempt's (or a joint round's)
// ctx: one part per group, two in a joint round's first asks (Pair).
type askJob struct {
	ctx   context.Context
	node  uint64
	parts []askPart
}

// askPart is one group's request in an askJob, its reply delivered on
// replies and read under boot, the group's bootstrap voters (replyConfig).
// req is shared by the attempt's jobs, read-only.
type askPart struct {
	req     *epochpb.ReadEpochRequest
	replies chan<- reply
	boot    []uint64
}

// send hands j to its replica's asker goroutine if that is idle, and
// otherwise (busy, not started yet, or the reader closed) runs it on a
// goroutine of its own. The attempt calling it holds a count of wg (a
// round, a joint round's partner read, or AtLeast), so Close waits for
// what it starts.
func (r *Reader) send(j askJob) {
	r.mu.Lock()
	jobs, ok := r.askers[j.node]
	if !ok && !r.closed {
		jobs = make(chan askJob)
		r.askers[j.node] = jobs
		r.wg.Add(1)
		go r.asker(jobs)
	}
	r.mu.Unlock()
	select {
	case jobs <- j: // nil once closed: never ready
	default:
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			r.ask(j)
		}()
	}
}

// asker sends the jobs handed to it, one at a time, until Close.
func (r *Reader) asker(jobs <-chan askJob) {
	defer r.wg.Done()
	for {
		select {
		case j := <-jobs:
			r.ask(j)
		case <-r.done:
			return
		}
	}
}

// ask sends j's requests to its node and delivers each part's reply,
// unless ctx ended (the attempt returned): this node's replica answers in
// process, another node's in one RPC for all parts (ReadEpochs), or one
// ReadEpoch each for a single part or a node that does not serve
// ReadEpochs (Unimplemented: one that predates it).
func (r *Reader) ask(j askJob) {
	if len(j.parts) > 1 && (r.serve == nil || j.node != r.self) {
		reqs := make([]*epochpb.ReadEpochRequest, len(j.parts))
		for i, p := range j.parts {
			reqs[i] = p.req
		}
		resp, err := r.callMany(j.ctx, j.node, reqs)
		if status.Code(err) != codes.Unimplemented {
			for i, p := range j.parts {
				res := resultOf(resp, i, err)
				var failed error
				if res.GetCode() != uint32(codes.OK) {
					failed = status.Error(codes.Code(res.GetCode()), res.GetMessage())
				}
				r.deliver(j, p, res.GetResponse(), failed)
			}
			return
		}
	}
	for _, p := range j.parts {
		var resp *epochpb.ReadEpochResponse
		var err error
		if r.serve != nil && j.node == r.self {
			resp, err = r.serve(j.ctx, p.req)
		} else {
			resp, err = r.call(j.ctx, j.node, p.req)
		}
		r.deliver(j, p, resp, err)
	}
}

// resultOf is the i-th result of a ReadEpochs call that returned resp and
// err: err's status when the call failed, Internal when the node sent too
// few results or an OK one without a response.
func resultOf(resp *epochpb.ReadEpochsResponse, i int, err error) *epochpb.EpochResult {
	if err != nil {
		st := status.Convert(err)
		return &epochpb.EpochResult{Code: uint32(st.Code()), Message: st.Message()}
	}
	if i >= len(resp.GetResults()) {
		return &epochpb.EpochResult{Code: uint32(codes.Internal), Message: fmt.Sprintf("epoch: ReadEpochs answered %d of %d reads", len(resp.GetResults()), i+1)}
	}
	res := resp.GetResults()[i]
	if res.GetCode() == uint32(codes.OK) && res.GetResponse() == nil {
		return &epochpb.EpochResult{Code: uint32(codes.Internal), Message: fmt.Sprintf("epoch: ReadEpochs result %d has neither a response nor an error", i)}
	}
	return res
}

// deliver hands p's reply (resp, or err) from j's node to its attempt,
// unless j's ctx ended.
func (r *Reader) deliver(j askJob, p askPart, resp *epochpb.ReadEpochResponse, err error) {
	rep := reply{node: j.node, err: err}
	if err == nil {
		rep.epoch, rep.conf = resp.GetEpoch(), replyConfig(resp, p.boot)
	}
	select {
	case p.replies <- rep:
	case <-j.ctx.Done():
	}
}

// readRemote sends req to node id's replica by RPC, over the node's
// Multiplex stream (transport.Dialer.Multiplexed: a message each way
// rather than a gRPC call's stream of its own): Reader.call's default.
func (r *Reader) readRemote(ctx context.Context, id uint64, req *epochpb.ReadEpochRequest) (*epochpb.ReadEpochResponse, error) {
	conn, err := r.dialer.Multiplexed(id)
	if err != nil {
		return nil, err
	}
	return epochpb.NewEpochClient(conn).ReadEpoch(ctx, req)
}

// readRemoteMany sends reqs to node id's replicas in one RPC, over the
// node's Multiplex stream: Reader.callMany's default.
func (r *Reader) readRemoteMany(ctx context.Context, id uint64, reqs []*epochpb.ReadEpochRequest) (*epochpb.ReadEpochsResponse, error) {
	conn, err := r.dialer.Multiplexed(id)
	if err != nil {
		return nil, err
	}
	return epochpb.NewEpochClient(conn).ReadEpochs(ctx, &epochpb.ReadEpochsRequest{Reads: reqs})
}
