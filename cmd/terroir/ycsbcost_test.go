package main

import (
	"strings"
	"testing"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// The benches count every Raft message a node sent, and the heartbeats
// and their replies among them, from terroir_raft_messages_sent_total's
// type label; other families count no heartbeats.
func TestHeartbeatsSentCountsHeartbeatsAndTheirReplies(t *testing.T) {
	const exposition = `# TYPE terroir_raft_messages_sent_total counter
terroir_raft_messages_sent_total{type="MsgApp"} 40
terroir_raft_messages_sent_total{type="MsgAppResp"} 38
terroir_raft_messages_sent_total{type="MsgHeartbeat"} 7
terroir_raft_messages_sent_total{type="MsgHeartbeatResp"} 6
terroir_raft_messages_sent_total{type="MsgReadIndex"} 1
# TYPE terroir_raft_proposals_total counter
terroir_raft_proposals_total 9
`
	parser := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := parser.TextToMetricFamilies(strings.NewReader(exposition))
	if err != nil {
		t.Fatal(err)
	}
	sent := mfs["terroir_raft_messages_sent_total"]
	if got := heartbeatsSent(sent); got != 13 {
		t.Errorf("heartbeatsSent = %v, want 13 (7 heartbeats and 6 replies)", got)
	}
	if got := sumMetric(sent); got != 92 {
		t.Errorf("sumMetric = %v, want all 92 messages", got)
	}
	if got := heartbeatsSent(mfs["terroir_raft_proposals_total"]); got != 0 {
		t.Errorf("heartbeatsSent of another family = %v, want 0", got)
	}
}
