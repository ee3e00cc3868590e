package topology

import (
	"errors"
	"fmt"
	"io"
	"reflect"
	"regexp"
	"sort"
	"strings"

	"gopkg.in/yaml.v3"
)

// fileSections names, in the user's terms, where each file type sits in
// a topology file, and the type itself for its list of settings.
var fileSections = map[string]struct {
	where string
	typ   reflect.Type
}{
	"fileTopology": {"at the top level", reflect.TypeFor[fileTopology]()},
	"fileRTT":      {"in an rtt entry", reflect.TypeFor[fileRTT]()},
	"fileNode":     {"in a node", reflect.TypeFor[fileNode]()},
	"fileGroup":    {"in a group", reflect.TypeFor[fileGroup]()},
}

var (
	unknownField = regexp.MustCompile(`line (\d+): field (\S+) not found in type topology\.(\w+)`)
	badValue     = regexp.MustCompile("line (\\d+): cannot unmarshal !!(\\w+) `([^`]*)` into (\\S+)")
)

// describeDecode turns a YAML decoding error into one that speaks the
// topology file's terms: "line 3: unknown setting raft_tik at the top
// level (did you mean raft_tick?)" rather than the decoder's Go type names.
// The result wraps ErrInvalid.
func describeDecode(err error) error {
	if errors.Is(err, io.EOF) {
		return fmt.Errorf("%w: the file is empty; a topology lists regions, nodes and groups (see examples/one-region.yaml)", ErrInvalid)
	}
	var te *yaml.TypeError
	if !errors.As(err, &te) {
		// A syntax error: the decoder's text names the line and is free of Go names.
		return fmt.Errorf("%w: %s", ErrInvalid, strings.TrimPrefix(err.Error(), "yaml: "))
	}
	var msgs []string
	for _, e := range te.Errors {
		if m := unknownField.FindStringSubmatch(e); m != nil {
			sec := fileSections[m[3]]
			msg := fmt.Sprintf("line %s: unknown setting %q %s", m[1], m[2], sec.where)
			if sec.typ != nil {
				known := settings(sec.typ)
				if near := nearest(m[2], known); near != "" {
					msg += fmt.Sprintf(" (did you mean %s?)", near)
				} else {
					msg += fmt.Sprintf(" (known: %s)", strings.Join(known, ", "))
				}
			}
			msgs = append(msgs, msg)
			continue
		}
		if m := badValue.FindStringSubmatch(e); m != nil {
			msgs = append(msgs, fmt.Sprintf("line %s: %q is not %s", m[1], m[3], goTypeInWords(m[4])))
			continue
		}
		msgs = append(msgs, e)
	}
	return fmt.Errorf("%w: %s", ErrInvalid, strings.Join(msgs, "; "))
}

// settings lists a file type's YAML keys, sorted.
func settings(t reflect.Type) []string {
	var out []string
	for i := range t.NumField() {
		if name, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ","); name != "" {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out
}

// nearest returns the known setting within two edits of s, if one is.
func nearest(s string, known []string) string {
	best, bestD := "", 3
	for _, k := range known {
		if d := editDistance(s, k); d < bestD {
			best, bestD = k, d
		}
	}
	return best
}

func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur := make([]int, len(b)+1)
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev = cur
	}
	return prev[len(b)]
}

func goTypeInWords(t string) string {
	switch {
	case strings.HasPrefix(t, "uint"), strings.HasPrefix(t, "int"):
		return "a whole number"
	case strings.HasPrefix(t, "float"):
		return "a number"
	case strings.HasPrefix(t, "[]"):
		return "a list"
	case t == "string":
		return "a string"
	default:
		return "the expected kind of value"
	}
}
