package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/detshare/detshare/shimv2/front"
)

// buildFront builds this command into a fresh directory and returns its path.
func buildFront(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	cmd := exec.Command("go", "build", "-o", dir+"/", ".")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return filepath.Join(dir, name)
}

// Every invocation that is not start, delete, --help or --version is the serving shim's: the front execs it (same
// arguments, same environment, same process); without it, start and serve fail naming its path.
func TestFrontExecsTheServingShim(t *testing.T) {
	bin := buildFront(t)
	serve := filepath.Join(filepath.Dir(bin), front.ServeName)
	bundle := t.TempDir()
	os.WriteFile(filepath.Join(bundle, "config.json"), []byte(`{}`), 0o644)

	for _, args := range [][]string{
		{"-namespace", "n", "-id", "x", "-address", "/run/containerd/containerd.sock"},
		{"-namespace", "n", "-id", "x", "-address", "/a.sock", "start"},
	} {
		cmd := exec.Command(bin, args...)
		cmd.Dir = bundle
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		err := cmd.Run()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 || !strings.Contains(stderr.String(), serve) {
			t.Errorf("%q without the serving shim: %v, stderr %q; want exit 1 naming %s", args, err, stderr.String(), serve)
		}
		if _, err := os.Stat(filepath.Join(bundle, "address")); err == nil {
			t.Errorf("%q without the serving shim wrote an address file", args)
		}
	}

	record := filepath.Join(t.TempDir(), "record")
	os.WriteFile(serve, []byte("#!/bin/sh\necho \"$$ $0 $*\" > "+record+"\necho \"env=$FRONT_TEST_X\" >> "+record+"\n"), 0o755)
	cmd := exec.Command(bin, "-namespace", "n", "-id", "x", "-address", "/a.sock", "-debug")
	cmd.Env = append(os.Environ(), "FRONT_TEST_X=kept")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("serving mode: %v\n%s", err, out)
	}
	got, _ := os.ReadFile(record)
	f := strings.Fields(string(got))
	if len(f) < 2 || f[0] != strconv.Itoa(cmd.Process.Pid) || strings.Join(f[1:], " ") != serve+" -namespace n -id x -address /a.sock -debug env=kept" {
		t.Errorf("serving shim ran as %q; want pid %d (exec, not a child), %s with the same arguments and environment", got, cmd.Process.Pid, serve)
	}
}
