package epoch

import "time"

// Phase is one step of the global epoch's round (paper §4.1, DESIGN.md §7)
// whose duration a node reports to a RoundObserver: the service's leader
// publishes epoch E and waits for every publisher (PhasePublish), then
// advances to E+1 (PhaseAdvance, whose first part, until the service's
// leader has applied E+1, is PhaseAdvanceCommit); a publisher's leader,
// for each Publish, commits E (PhasePublisherCommit) and then waits until
// a majority of its replicas shows it (PhasePublisherCertify). A round's
// interval is about PhasePublish plus PhaseAdvance; PhasePublish is the
// farthest publisher's RTT plus its two phases.
type Phase uint8

// The phases, in the order a round runs them.
const (
	// PhasePublish: the service's leader pushes E to every publisher in
	// its set and waits until all acknowledge (Global.publishAll).
	PhasePublish Phase = iota
	// PhaseAdvance: the service's leader commits E+1 through its Raft
	// group and a majority of its replicas applies it (Global.advance).
	PhaseAdvance
	// PhaseAdvanceCommit: the part of PhaseAdvance until the service's
	// leader has committed and applied E+1 (its Propose returned); the
	// rest, PhaseAdvance less this, is the wait for a majority of the
	// service's replicas to apply it (Global.advance).
	PhaseAdvanceCommit
	// PhasePublisherCommit: at a publisher's leader, E committed through
	// the publisher's Raft group and applied there (Server.Publish).
	PhasePublisherCommit
	// PhasePublisherCertify: at a publisher's leader, from that commit
	// until a majority read of the publisher shows E (Server.Publish).
	PhasePublisherCertify
	// NumPhases is how many phases there are.
	NumPhases
)

// phaseNames are the phases' names, as metrics label them.
var phaseNames = [NumPhases]string{"publish", "advance", "advance_commit", "publisher_commit", "publisher_certify"}

// String returns the phase's name: publish, advance, advance_commit,
// publisher_commit or publisher_certify.
func (p Phase) String() string {
	if p < NumPhases {
		return phaseNames[p]
	}
	return "unknown"
}

// RoundObserver receives the duration of each phase a node ran, phase by
// phase, only for phases that succeeded. It is called from the service's
// loop and from Publish handlers, so it must be quick and safe for
// concurrent use; a node's metrics implement it (terroir_global_epoch_round_seconds).
type RoundObserver func(p Phase, d time.Duration)
