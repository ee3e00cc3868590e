// Package backup takes consistent backups of a running cluster and restores
// them into a fresh one (DESIGN.md §14): a backup is one Linearizable
// snapshot at epoch e over every range of every region, read lock-free (it
// never delays a writer) under a GC protection of e, written as one SST
// file per range and a manifest holding e, the ranges and each file's
// checksum. Restore refuses a damaged or incomplete backup, and a cluster
// that holds data, before it writes anything.
package backup

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// Errors of backup and restore.
var (
	// ErrBackupExists: the backup's directory exists and is not empty.
	ErrBackupExists = errors.New("backup: the target directory is not empty")
	// ErrIncomplete: no manifest (a backup that never finished), or a file
	// it names is missing.
	ErrIncomplete = errors.New("backup: incomplete backup")
	// ErrCorrupt: a manifest that does not decode, or a file whose checksum,
	// size or contents differ from the manifest's.
	ErrCorrupt = errors.New("backup: damaged backup")
	// ErrNotEmpty: a restore into a cluster that holds data.
	ErrNotEmpty = errors.New("backup: the target cluster is not empty")
)

// manifestName is the manifest's file name; it is written last, so a
// directory without one holds an unfinished backup.
const manifestName = "MANIFEST.json"

// formatVersion is the manifest format this package writes and reads.
const formatVersion = 1

// Manifest describes a finished backup.
type Manifest struct {
	Format int `json:"format"`
	// Epoch is the snapshot's epoch: the backup holds exactly the state a
	// Linearizable snapshot at Epoch reads.
	Epoch uint64 `json:"epoch"`
	// Created is when the backup finished (RFC 3339, for operators).
	Created string `json:"created"`
	// Ranges tile the key space, by start key.
	Ranges []Range `json:"ranges"`
	// An incremental backup holds, for each key written in [Since, Epoch),
	// its newest value or its deletion; Since is the epoch of its base
	// backup, in directory Base, whose manifest's SHA-256 is BaseSHA256.
	// A full backup leaves the three unset.
	Since      uint64 `json:"since,omitempty"`
	Base       string `json:"base,omitempty"`
	BaseSHA256 string `json:"base_sha256,omitempty"`

	sum string // this manifest file's SHA-256 (hex), as read
}

// Incremental reports whether the backup holds changes on a base backup.
func (m *Manifest) Incremental() bool { return m.Base != "" }

// Range is one file of a backup: the pairs of [Start, End) (an empty End:
// to the end of the key space) at the backup's epoch.
type Range struct {
	RangeID uint64 `json:"range_id"`
	Region  string `json:"region"`
	Start   []byte `json:"start"`
	End     []byte `json:"end"`
	File    string `json:"file"`
	Keys    int    `json:"keys"`              // entries: pairs, and deletions in an incremental
	Deletes int    `json:"deletes,omitempty"` // deletions (incremental backups only)
	Bytes   int64  `json:"bytes"`             // the file's size
	SHA256  string `json:"sha256"`            // hex
}

// Keys returns the number of pairs the backup holds.
func (m *Manifest) Keys() int {
	n := 0
	for _, r := range m.Ranges {
		n += r.Keys
	}
	return n
}

// Bytes returns the size of the backup's files.
func (m *Manifest) Bytes() int64 {
	var n int64
	for _, r := range m.Ranges {
		n += r.Bytes
	}
	return n
}

// writeManifest writes m into dir atomically (a temporary file renamed).
func writeManifest(dir string, m *Manifest) error {
	data, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	tmp := filepath.Join(dir, manifestName+".tmp")
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(dir, manifestName))
}

// ReadManifest reads and vets dir's manifest. Errors: ErrIncomplete (none),
// ErrCorrupt (undecodable, another format, ranges that do not tile the key
// space).
func ReadManifest(dir string) (*Manifest, error) {
	data, err := os.ReadFile(filepath.Join(dir, manifestName))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%w: %s has no %s (the backup never finished)", ErrIncomplete, dir, manifestName)
	}
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(data)
	m := &Manifest{sum: hex.EncodeToString(sum[:])}
	if err := json.Unmarshal(data, m); err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrCorrupt, manifestName, err)
	}
	if m.Format != formatVersion {
		return nil, fmt.Errorf("%w: %s: format %d, this version reads %d", ErrCorrupt, manifestName, m.Format, formatVersion)
	}
	for i, r := range m.Ranges {
		switch {
		case i == 0 && len(r.Start) != 0:
			return nil, fmt.Errorf("%w: %s: the first range starts at %q, not at the beginning", ErrCorrupt, manifestName, r.Start)
		case i > 0 && string(m.Ranges[i-1].End) != string(r.Start):
			return nil, fmt.Errorf("%w: %s: range %d starts at %q, its predecessor ends at %q", ErrCorrupt, manifestName, r.RangeID, r.Start, m.Ranges[i-1].End)
		case i == len(m.Ranges)-1 && len(r.End) != 0:
			return nil, fmt.Errorf("%w: %s: the last range ends at %q, not at the end", ErrCorrupt, manifestName, r.End)
		case filepath.Base(r.File) != r.File:
			return nil, fmt.Errorf("%w: %s: file name %q", ErrCorrupt, manifestName, r.File)
		}
	}
	if len(m.Ranges) == 0 {
		return nil, fmt.Errorf("%w: %s names no ranges", ErrCorrupt, manifestName)
	}
	if m.Incremental() && (m.Since == 0 || m.Since > m.Epoch || m.BaseSHA256 == "") {
		return nil, fmt.Errorf("%w: %s: an incremental backup at epoch %d since epoch %d, base manifest SHA-256 %q", ErrCorrupt, manifestName, m.Epoch, m.Since, m.BaseSHA256)
	}
	return m, nil
}
