package table

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unsafe"
)

// cClientProgram exercises detshare_table_client.h as libdetshare does.
//
//	version PATH           print ds_table_map_ro's return code
//	wait PATH SLOT         wait (futex, read-only mapping) for the slot's grant epoch to change; print the grant
//	page PATH              print ds_client_map's return code
const cClientProgram = `
#include "detshare_table_client.h"
#include <stdlib.h>
int main(int argc, char **argv) {
    if (argc < 3) return 10;
    if (strcmp(argv[1], "version") == 0) {
        const struct ds_table_header *h;
        printf("rc=%d\n", ds_table_map_ro(argv[2], &h));
        return 0;
    }
    if (strcmp(argv[1], "page") == 0) {
        struct ds_client_page *p;
        printf("rc=%d\n", ds_client_map(argv[2], &p));
        return 0;
    }
    if (strcmp(argv[1], "wait") == 0 && argc == 4) {
        const struct ds_table_header *h;
        if (ds_table_map_ro(argv[2], &h) != 0) return 11;
        const struct ds_container *c = ds_table_container(h, (uint32_t)atoi(argv[3]));
        uint32_t seen = ds_grant_epoch(c);
        printf("waiting\n");
        fflush(stdout);
        uint64_t deadline = ds_monotonic_ns() + 20000000000ull;
        while (ds_grant_epoch(c) == seen) {
            uint64_t now = ds_monotonic_ns();
            if (now >= deadline) { printf("timeout\n"); return 12; }
            int rc = ds_futex_wait(&c->grant_epoch, seen, deadline - now);
            if (rc != 0 && rc != -ETIMEDOUT) { printf("futex rc=%d\n", rc); return 13; }
        }
        struct ds_grant g;
        if (ds_grant_read(c, &g) != 0) return 14;
        printf("groups=%llu sms=%u mode=%u\n", (unsigned long long)g.groups, g.sms, g.mode);
        return 0;
    }
    if (strcmp(argv[1], "badargs") == 0) {
        struct ds_grant g;
        printf("%d %d %d %d %d\n", ds_grant_read(NULL, &g), ds_table_map_ro(NULL, NULL), ds_proc_attach(NULL, 1, 1, 1, 0),
               ds_proc_detach(NULL, 0), ds_futex_wait(NULL, 0, 1));
        return 0;
    }
    return 15;
}
`

func TestCClientRefusesOtherVersion(t *testing.T) {
	bin := compileC(t, cClientProgram)
	tb := newTable(t)
	reg, _ := tb.Register(RegisterRequest{ID: "v", Weight: 1})
	path := tb.Paths().Table()
	tb.Close()
	if out, _ := exec.Command(bin, "version", path).Output(); strings.TrimSpace(string(out)) != "rc=0" {
		t.Fatalf("current version refused: %s", out)
	}
	b, _ := os.ReadFile(path)
	(*Header)(unsafe.Pointer(&b[0])).ABIVersion = ABIVersion + 1
	os.WriteFile(path, b, 0o644)
	if out, _ := exec.Command(bin, "version", path).Output(); strings.TrimSpace(string(out)) != "rc=-1000" {
		t.Errorf("C client on a version %d table: %s, want rc=-1000 (DS_EVERSION)", ABIVersion+1, out)
	}
	// Client page of another version: refused by both sides.
	pb, _ := os.ReadFile(reg.ClientPagePath)
	(*ClientPage)(unsafe.Pointer(&pb[0])).ABIVersion = ABIVersion + 1
	os.WriteFile(reg.ClientPagePath, pb, 0o644)
	if out, _ := exec.Command(bin, "page", reg.ClientPagePath).Output(); strings.TrimSpace(string(out)) != "rc=-1000" {
		t.Errorf("C client on a version %d page: %s", ABIVersion+1, out)
	}
	if _, err := OpenClientPage(reg.ClientPagePath); !errors.Is(err, ErrVersionMismatch) {
		t.Errorf("Go on a version %d page: %v", ABIVersion+1, err)
	}
	if out, _ := exec.Command(bin, "version", filepath.Join(t.TempDir(), "none")).Output(); strings.TrimSpace(string(out)) != "rc=-2" {
		t.Errorf("missing table: %s, want rc=-2 (ENOENT)", out)
	}
}

func TestCClientChecksArguments(t *testing.T) {
	out, err := exec.Command(compileC(t, cClientProgram), "badargs", "x").Output()
	if err != nil || strings.TrimSpace(string(out)) != "-22 -22 -22 -22 -22" {
		t.Fatalf("NULL arguments: %q %v, want every call to return -EINVAL", out, err)
	}
}

// TestCClientWakesOnGrant: a client blocked in FUTEX_WAIT on grant_epoch through its read-only mapping is woken
// by PublishGrant in another process and reads the new grant.
func TestCClientWakesOnGrant(t *testing.T) {
	tb := newTable(t)
	reg, _ := tb.Register(RegisterRequest{ID: "w", Weight: 1})
	cmd := exec.Command(compileC(t, cClientProgram), "wait", tb.Paths().Table(), fmt.Sprint(reg.Slot))
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	r := bufio.NewReader(stdout)
	if l, _ := r.ReadString('\n'); l != "waiting\n" {
		t.Fatalf("child: %q", l)
	}
	time.Sleep(50 * time.Millisecond) // let it block in the futex
	if err := tb.PublishGrant(reg.Slot, Grant{Groups: 0b111, SMs: 24, Mode: ModeSpatial}); err != nil {
		t.Fatal(err)
	}
	l, _ := r.ReadString('\n')
	if err := cmd.Wait(); err != nil || l != fmt.Sprintf("groups=7 sms=24 mode=%d\n", ModeSpatial) {
		t.Fatalf("child after grant: %q %v", l, err)
	}
}
