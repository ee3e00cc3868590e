// Package ycsb drives the YCSB core workloads A–F (Cooper et al., SoCC 2010)
// against a Terroir client: the standard operation mix, request distributions
// (uniform, zipfian, latest), record layout and key naming, each operation one
// transaction, latencies in HDR histograms.
package ycsb

import (
	"fmt"
	"strings"
)

// Distribution is a YCSB request distribution.
type Distribution string

// Request distributions, as YCSB names them.
const (
	Uniform Distribution = "uniform"
	Zipfian Distribution = "zipfian"
	Latest  Distribution = "latest"
)

// Workload is a YCSB core workload's properties.
type Workload struct {
	// Name is the workload's letter (a–f), or "custom".
	Name string
	// RecordCount records are loaded before the run (YCSB recordcount).
	RecordCount int
	// OperationCount operations run, or 0 to run for a duration instead.
	OperationCount int
	// FieldCount fields of FieldLength bytes make one record: FieldCount ×
	// FieldLength bytes, stored as one value.
	FieldCount, FieldLength int
	// Proportions of reads, updates, inserts, scans and read-modify-writes;
	// they sum to 1.
	Read, Update, Insert, Scan, ReadModifyWrite float64
	// Distribution picks the keys of reads, updates, scans and read-modify-writes.
	Distribution Distribution
	// MaxScanLength bounds a scan's length, drawn uniformly from [1, MaxScanLength].
	MaxScanLength int
}

// Core returns core workload `letter` (a–f, either case) with YCSB's defaults:
// 1000 records, 1000 operations, 10 fields of 100 bytes. It fails for any
// other letter.
func Core(letter string) (Workload, error) {
	w := Workload{Name: strings.ToLower(letter), RecordCount: 1000, OperationCount: 1000, FieldCount: 10, FieldLength: 100,
		Distribution: Zipfian, MaxScanLength: 100}
	switch w.Name {
	case "a": // update heavy
		w.Read, w.Update = 0.5, 0.5
	case "b": // read mostly
		w.Read, w.Update = 0.95, 0.05
	case "c": // read only
		w.Read = 1
	case "d": // read latest
		w.Read, w.Insert, w.Distribution = 0.95, 0.05, Latest
	case "e": // short ranges
		w.Scan, w.Insert = 0.95, 0.05
	case "f": // read-modify-write
		w.Read, w.ReadModifyWrite = 0.5, 0.5
	default:
		return Workload{}, fmt.Errorf("ycsb: unknown core workload %q (a–f)", letter)
	}
	return w, nil
}

// Validate reports a workload that cannot run.
func (w Workload) Validate() error {
	sum := w.Read + w.Update + w.Insert + w.Scan + w.ReadModifyWrite
	switch {
	case w.RecordCount <= 0:
		return fmt.Errorf("ycsb: recordcount %d must be positive", w.RecordCount)
	case w.FieldCount <= 0 || w.FieldLength <= 0:
		return fmt.Errorf("ycsb: fieldcount and fieldlength must be positive")
	case sum < 0.999 || sum > 1.001:
		return fmt.Errorf("ycsb: operation proportions sum to %.3f, not 1", sum)
	case w.Scan > 0 && w.MaxScanLength <= 0:
		return fmt.Errorf("ycsb: maxscanlength must be positive")
	}
	switch w.Distribution {
	case Uniform, Zipfian, Latest:
		return nil
	}
	return fmt.Errorf("ycsb: unknown request distribution %q (uniform, zipfian, latest)", w.Distribution)
}

// Op is one kind of operation.
type Op int

// Operation kinds.
const (
	OpRead Op = iota
	OpUpdate
	OpInsert
	OpScan
	OpReadModifyWrite
	numOps
)

var opNames = [numOps]string{"read", "update", "insert", "scan", "read-modify-write"}

// String returns YCSB's name for the operation.
func (o Op) String() string { return opNames[o] }

// pick maps u ∈ [0, 1) onto an operation by the workload's proportions.
func (w Workload) pick(u float64) Op {
	for i, p := range []float64{w.Read, w.Update, w.Insert, w.Scan, w.ReadModifyWrite} {
		if u < p {
			return Op(i)
		}
		u -= p
	}
	return OpRead
}
