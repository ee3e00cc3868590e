package transport

import (
	"net"
	"sync"
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// frameCounter counts the HTTP/2 frames, by type, in one direction of a
// connection's plaintext bytes (after the client's preface, if any).
type frameCounter struct {
	mu     sync.Mutex
	skip   int // preface bytes still to skip
	buf    []byte
	byType map[byte]int
}

func (f *frameCounter) feed(p []byte) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.skip > 0 {
		n := min(f.skip, len(p))
		f.skip -= n
		p = p[n:]
	}
	f.buf = append(f.buf, p...)
	for len(f.buf) >= 9 {
		length := int(f.buf[0])<<16 | int(f.buf[1])<<8 | int(f.buf[2])
		if len(f.buf) < 9+length {
			return
		}
		f.byType[f.buf[3]]++
		f.buf = f.buf[9+length:]
	}
}

func (f *frameCounter) count(typ byte) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.byType[typ]
}

// countingConn feeds what a server connection reads and writes to counters.
type countingConn struct {
	net.Conn
	in, out *frameCounter
}

func (c countingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.in.feed(p[:n])
	return n, err
}

func (c countingConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.out.feed(p[:n])
	return n, err
}

type countingListener struct {
	net.Listener
	in, out *frameCounter
}

func (l countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return countingConn{Conn: c, in: l.in, out: l.out}, nil
}

const http2Ping = 0x6

// TestAQuietConnectionSendsNoFlowControlPings sends Raft batches and
// pings one at a time, as an idle cluster does, and counts the HTTP/2
// frames on the receiving node's connection: with fixed flow-control
// windows neither end adds PING frames to measure the bandwidth-delay
// product (issue 17; without the windows each message drew one).
func TestAQuietConnectionSendsNoFlowControlPings(t *testing.T) {
	in := &frameCounter{skip: len("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"), byType: map[byte]int{}}
	out := &frameCounter{byType: map[byte]int{}}
	_, nodes := startNodesListening(t, 0, func(id uint64, l net.Listener) net.Listener {
		if id != 2 {
			return l
		}
		return countingListener{Listener: l, in: in, out: out}
	})
	const n = 40
	for i := 1; i <= n; i++ {
		nodes[1].raft.Send(9, &raftpb.Message{To: proto.Uint64(2), Index: proto.Uint64(uint64(i))})
		deadline := time.Now().Add(5 * time.Second)
		for nodes[2].rec.count() < i && time.Now().Before(deadline) {
			time.Sleep(100 * time.Microsecond)
		}
		if nodes[2].rec.count() < i {
			t.Fatalf("message %d not delivered within 5 s", i)
		}
		time.Sleep(2 * time.Millisecond) // let any PING and its ACK cross
	}
	pingRTT(t, nodes[1].raft.dialer, 2, n)
	time.Sleep(20 * time.Millisecond)
	data := in.count(0x0)
	if data < n {
		t.Fatalf("counted %d DATA frames from the sender, want at least %d: the counter is not reading the connection", data, n)
	}
	if got := in.count(http2Ping) + out.count(http2Ping); got > 0 {
		t.Errorf("%d PING frames crossed a connection carrying %d Raft batches and %d pings one at a time, want none", got, n, n)
	}
}
