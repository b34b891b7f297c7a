package table

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"unsafe"
)

// roViewProgram maps the table exactly as a container does (read-only, via detshare_table_client.h) and then does
// what argv[2] says: "read" prints its grant, "own-grant" writes its own grant, "other" writes another
// container's entry, "mprotect" tries to make the mapping writable, "open-rw" tries to open the table for writing.
const roViewProgram = `
#include "detshare_table_client.h"
#include <stdlib.h>
int main(int argc, char **argv) {
    if (argc != 5) return 10;
    const struct ds_table_header *h;
    int rc = ds_table_map_ro(argv[1], &h);
    if (rc != 0) { printf("map rc=%d\n", rc); return 11; }
    uint32_t own = (uint32_t)atoi(argv[3]), other = (uint32_t)atoi(argv[4]);
    const struct ds_container *c = ds_table_container(h, own);
    const struct ds_container *o = ds_table_container(h, other);
    struct ds_grant g;
    if (ds_grant_read(c, &g) != 0) return 12;
    if (strcmp(argv[2], "read") == 0) {
        printf("groups=%llu sms=%u epoch=%u id=%s other=%s\n", (unsigned long long)g.groups, g.sms, g.epoch, c->id, o->id);
        return 0;
    }
    if (strcmp(argv[2], "own-grant") == 0) {
        ((struct ds_container *)(uintptr_t)c)->grant_groups = ~0ull;   /* must fault */
        return 20;
    }
    if (strcmp(argv[2], "other") == 0) {
        ((struct ds_container *)(uintptr_t)o)->sm_groups_req = 64;     /* must fault */
        return 21;
    }
    if (strcmp(argv[2], "mprotect") == 0) {
        if (mprotect((void *)(uintptr_t)h, DS_TABLE_SIZE, PROT_READ | PROT_WRITE) == 0) return 22;
        printf("mprotect errno=%d\n", errno);
        return errno == EACCES ? 0 : 23;
    }
    if (strcmp(argv[2], "open-rw") == 0) {
        int fd = open(argv[1], O_RDWR);
        if (fd >= 0) return 24;
        printf("open errno=%d\n", errno);
        return errno == EACCES ? 0 : 25;
    }
    return 13;
}
`

// TestReadOnlyViewCannotWrite proves the single-writer rule holds for a process given the container view: it can
// read its grant, but writing its own grant or another container's entry kills it with SIGSEGV, it cannot make
// the mapping writable, and (as a non-root user) it cannot open the table for writing. And the table is unchanged.
func TestReadOnlyViewCannotWrite(t *testing.T) {
	tb := newTable(t)
	own, err := tb.Register(RegisterRequest{ID: "mine", Weight: 1})
	if err != nil {
		t.Fatal(err)
	}
	other, err := tb.Register(RegisterRequest{ID: "theirs", Tier: TierLatencyCritical, SMGroups: 2, SMs: 16, Weight: 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := tb.PublishGrant(own.Slot, Grant{Groups: 0b110, SMs: 16, Mode: ModeSpatial}); err != nil {
		t.Fatal(err)
	}
	bin := compileC(t, roViewProgram)
	// The non-root runs below need to traverse the test's temporary directories (0700 by default).
	for _, p := range []string{bin, tb.Paths().Dir} {
		for d := filepath.Dir(p); d != "/" && d != os.TempDir(); d = filepath.Dir(d) {
			if err := os.Chmod(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
	}
	before := append([]byte(nil), unsafe.Slice((*byte)(unsafe.Pointer(tb.Header())), TableSize)...)
	run := func(mode string, cred *syscall.Credential) (*os.ProcessState, string) {
		cmd := exec.Command(bin, tb.Paths().Table(), mode, fmt.Sprint(own.Slot), fmt.Sprint(other.Slot))
		if cred != nil {
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
		}
		out, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			t.Fatalf("%s: %v", mode, err)
		}
		return cmd.ProcessState, string(out)
	}
	st, out := run("read", nil)
	if st.ExitCode() != 0 || !strings.Contains(out, "groups=6 sms=16") || !strings.Contains(out, "other=theirs") {
		t.Fatalf("read through the container view: exit %d, %q", st.ExitCode(), out)
	}
	for _, mode := range []string{"own-grant", "other"} {
		st, out := run(mode, nil)
		ws := st.Sys().(syscall.WaitStatus)
		if !ws.Signaled() || ws.Signal() != syscall.SIGSEGV {
			t.Errorf("%s: child was not killed by SIGSEGV: %v, output %q", mode, st, out)
		}
	}
	if st, out := run("mprotect", nil); st.ExitCode() != 0 {
		t.Errorf("mprotect to writable: exit %d %q (22 means it succeeded)", st.ExitCode(), out)
	}
	if haveRoot(t, "open the table as another user") {
		nobody := &syscall.Credential{Uid: 65534, Gid: 65534}
		if st, out := run("read", nobody); st.ExitCode() != 0 {
			t.Fatalf("non-root read-only map: exit %d %q", st.ExitCode(), out)
		}
		if st, out := run("open-rw", &syscall.Credential{Uid: 65534, Gid: 65534}); st.ExitCode() != 0 {
			t.Errorf("non-root open O_RDWR: exit %d %q (24 means it succeeded)", st.ExitCode(), out)
		}
	}
	after := unsafe.Slice((*byte)(unsafe.Pointer(tb.Header())), TableSize)
	if string(before) != string(after) {
		t.Error("the table changed under a read-only view")
	}
	g, _ := tb.ReadGrant(own.Slot)
	if g.Groups != 0b110 {
		t.Errorf("own grant changed to %#x", g.Groups)
	}
}

// TestGoReadOnlyViewFaults: the Go read-only mapping (OpenReadOnly, used by viewers) faults on write too, and
// refuses the writer API.
func TestGoReadOnlyViewFaults(t *testing.T) {
	if dir := os.Getenv("DETSHARE_TEST_ROWRITE"); dir != "" {
		ro, err := OpenReadOnly(dir)
		if err != nil {
			os.Exit(3)
		}
		if err := ro.PublishGrant(0, Grant{}); err == nil {
			os.Exit(4)
		}
		ro.Container(0).GrantGroups = 1 // must fault: Go turns the SIGSEGV into a fatal error (exit 2)
		os.Exit(5)
	}
	tb := newTable(t)
	cmd := exec.Command(os.Args[0], "-test.run=^TestGoReadOnlyViewFaults$")
	cmd.Env = append(os.Environ(), "DETSHARE_TEST_ROWRITE="+tb.Paths().Dir)
	out, _ := cmd.CombinedOutput()
	if cmd.ProcessState.ExitCode() != 2 || !strings.Contains(string(out), "unexpected fault address") {
		t.Fatalf("child exit %d, want a fault (exit 2); output:\n%s", cmd.ProcessState.ExitCode(), out)
	}
}

// haveRoot tells whether a root-only part of a test can run. Without root it fails the test, unless
// DETSHARE_SKIP_ROOT=1 says to skip such parts.
func haveRoot(t *testing.T, what string) bool {
	if os.Getuid() == 0 {
		return true
	}
	if os.Getenv("DETSHARE_SKIP_ROOT") == "1" {
		t.Logf("DETSHARE_SKIP_ROOT=1: not root, skipping: %s", what)
		return false
	}
	t.Fatalf("root is needed to %s (set DETSHARE_SKIP_ROOT=1 to skip this part)", what)
	return false
}
