// Package version names the build: the module version when built from a
// tagged module, else the VCS revision Go stamps into the binary.
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// Version is set at link time (-ldflags "-X .../internal/version.Version=v1.2.3");
// empty means the build information decides.
var Version = ""

// String returns the version, the commit (with "+dirty" for a modified
// tree) and the Go version, e.g. "v0.9.0 (6841dd4, go1.26.0)".
func String() string {
	v, rev, dirty := Version, "", false
	if info, ok := debug.ReadBuildInfo(); ok {
		if v == "" && info.Main.Version != "" && info.Main.Version != "(devel)" {
			v = info.Main.Version
		}
		for _, s := range info.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				dirty = s.Value == "true"
			}
		}
	}
	if v == "" {
		v = "dev"
	}
	if len(rev) > 7 {
		rev = rev[:7]
	}
	if rev == "" {
		rev = "unknown commit"
	} else if dirty {
		rev += "+dirty"
	}
	return fmt.Sprintf("%s (%s, %s)", v, rev, runtime.Version())
}
