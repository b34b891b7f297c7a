package runcwrap

import (
	"bytes"
	"strings"
	"testing"
)

// The wrapper answers its own --help and --version; a command's help and everything else stay runc's.
func TestOwnHelpAndVersionOnlyWithoutACommand(t *testing.T) {
	for _, c := range []struct {
		args             []string
		handled, version bool
	}{
		{[]string{"--help"}, true, false},
		{[]string{"-h"}, true, false},
		{[]string{"help"}, true, false},
		{[]string{"--detshare-run-dir", "/x", "--help"}, true, false},
		{[]string{"--version"}, true, true},
		{[]string{"--root", "/r", "-v"}, true, true},
		{[]string{"create", "--help"}, false, false},
		{[]string{"help", "create"}, false, false},
		{[]string{"state", "c1"}, false, false},
	} {
		inv, err := Parse(c.args)
		if err != nil {
			t.Fatalf("%v: %v", c.args, err)
		}
		var b bytes.Buffer
		h, v := ownHelpOrVersion(inv, &b, "/usr/bin/detshare-runtime", "1.2.3")
		if h != c.handled || v != c.version {
			t.Errorf("%v: handled %v version %v, want %v %v", c.args, h, v, c.handled, c.version)
		}
		switch {
		case h && v && b.String() != "detshare-runtime version 1.2.3\n":
			t.Errorf("%v: version line %q", c.args, b.String())
		case h && !v && (!strings.Contains(b.String(), "DetShare's runc wrapper for Docker") ||
			!strings.Contains(b.String(), `"path": "/usr/bin/detshare-runtime"`) || !strings.Contains(b.String(), FlagFailClosed)):
			t.Errorf("%v: help lacks what the wrapper is, its path or its flags:\n%s", c.args, b.String())
		case !h && b.Len() != 0:
			t.Errorf("%v: wrote %q though runc answers", c.args, b.String())
		}
	}
}
