package table

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// headerPath is detshare_table.h next to this test file.
func headerPath(t testing.TB) string {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("cannot locate the test source")
	}
	return filepath.Join(filepath.Dir(file), "detshare_table.h")
}

// needGCC fails the test loudly when there is no C compiler (DETSHARE_SKIP_GCC=1 skips instead).
func needGCC(t testing.TB) string {
	cc, err := exec.LookPath("gcc")
	if err != nil {
		if os.Getenv("DETSHARE_SKIP_GCC") == "1" {
			t.Skip("DETSHARE_SKIP_GCC=1: no gcc")
		}
		t.Fatalf("gcc is needed to check the C/Go table ABI: %v (set DETSHARE_SKIP_GCC=1 to skip)", err)
	}
	return cc
}

// compileC builds a C11 program against the table headers with the project's warning flags.
func compileC(t testing.TB, src string, extra ...string) string {
	cc := needGCC(t)
	dir := t.TempDir()
	c := filepath.Join(dir, "prog.c")
	if err := os.WriteFile(c, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "prog")
	args := append([]string{"-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", "-D_GNU_SOURCE",
		"-I", filepath.Dir(headerPath(t)), "-o", bin, c}, extra...)
	out, err := exec.Command(cc, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("compile C program: %v\n%s\n--- source ---\n%s", err, out, src)
	}
	return bin
}

type mirror struct {
	cName string
	goVal any
}

var mirrors = []mirror{
	{"ds_table_header", Header{}},
	{"ds_gpu", GPU{}},
	{"ds_container", Container{}},
	{"ds_proc", Proc{}},
	{"ds_client_page", ClientPage{}},
	{"ds_doorbell", Doorbell{}},
}

// TestABIMatchesC compiles a program against detshare_table.h that prints the size and offset of every field and
// every constant, and compares them with the Go mirror. Any disagreement fails.
func TestABIMatchesC(t *testing.T) {
	var b strings.Builder
	b.WriteString("#include <stdio.h>\n#include <stddef.h>\n#include \"detshare_table.h\"\nint main(void) {\n")
	want := map[string]uint64{}
	for _, m := range mirrors {
		typ := reflect.TypeOf(m.goVal)
		fmt.Fprintf(&b, "printf(\"%s.sizeof %%zu\\n\", sizeof(struct %s));\n", m.cName, m.cName)
		want[m.cName+".sizeof"] = uint64(typ.Size())
		for i := 0; i < typ.NumField(); i++ {
			f := typ.Field(i)
			cf := f.Tag.Get("c")
			if cf == "" {
				t.Fatalf("Go field %s.%s has no c tag", typ.Name(), f.Name)
			}
			fmt.Fprintf(&b, "printf(\"%s.%s.offset %%zu\\n\", offsetof(struct %s, %s));\n", m.cName, cf, m.cName, cf)
			fmt.Fprintf(&b, "printf(\"%s.%s.size %%zu\\n\", sizeof(((struct %s *)0)->%s));\n", m.cName, cf, m.cName, cf)
			want[m.cName+"."+cf+".offset"] = uint64(f.Offset)
			want[m.cName+"."+cf+".size"] = uint64(f.Type.Size())
		}
	}
	consts := map[string]uint64{
		"DS_TABLE_MAGIC": TableMagic, "DS_CLIENT_MAGIC": ClientMagic, "DS_DOORBELL_MAGIC": DoorbellMagic,
		"DS_TABLE_ABI_VERSION": ABIVersion, "DS_MAX_GPUS": MaxGPUs, "DS_MAX_CONTAINERS": MaxContainers,
		"DS_MAX_SM_GROUPS": MaxSMGroups, "DS_MAX_PROCS": MaxProcs, "DS_ID_LEN": IDLen,
		"DS_LAT_FINE_BUCKETS": LatFineBuckets, "DS_LAT_FINE_SUB": LatFineSub, "DS_LAT_FINE_MIN_OCT": LatFineMinOct,
		"DS_SLO_ACTIVE": SLOActive, "DS_SLO_MISS": SLOMiss, "DS_SLO_INFEASIBLE": SLOInfeasible, "DS_SLO_HOLDING": SLOHolding,
		"DS_GPUS_OFFSET": GPUsOffset, "DS_CONTAINERS_OFFSET": ContainersOffset, "DS_TABLE_SIZE": TableSize,
		"DS_TABLE_INITIALISING": uint64(TableInitialising), "DS_TABLE_READY": uint64(TableReady),
		"DS_GPU_ABSENT": uint64(GPUAbsent), "DS_GPU_PRESENT": uint64(GPUPresent),
		"DS_SPLIT_UNKNOWN": uint64(SplitUnknown), "DS_SPLIT_PUBLISHING": uint64(SplitPublishing),
		"DS_SPLIT_PUBLISHED": uint64(SplitPublished),
		"DS_MPS_UNKNOWN":     uint64(MPSUnknown), "DS_MPS_ABSENT": uint64(MPSAbsent), "DS_MPS_RUNNING": uint64(MPSRunning),
		"DS_MPS_FAILED": uint64(MPSFailed),
		"DS_MODE_NONE":  uint64(ModeNone), "DS_MODE_SPATIAL": uint64(ModeSpatial), "DS_MODE_TEMPORAL": uint64(ModeTemporal),
		"DS_MODE_UNRESTRICTED": uint64(ModeUnrestricted),
		"DS_SLOT_FREE":         uint64(SlotFree), "DS_SLOT_RESERVED": uint64(SlotReserved), "DS_SLOT_ACTIVE": uint64(SlotActive),
		"DS_SLOT_DRAINING":    uint64(SlotDraining),
		"DS_TIER_BEST_EFFORT": uint64(TierBestEffort), "DS_TIER_BURSTABLE": uint64(TierBurstable),
		"DS_TIER_LATENCY_CRITICAL": uint64(TierLatencyCritical),
		"DS_ROLE_NONE":             uint64(RoleNone), "DS_ROLE_PREFILL": uint64(RolePrefill), "DS_ROLE_DECODE": uint64(RoleDecode),
		"DS_CF_LEND": uint64(FlagLend), "DS_CF_HOST_TENANT": uint64(FlagHostTenant),
		"DS_PROC_FREE": uint64(ProcFree), "DS_PROC_CLAIMING": uint64(ProcClaiming), "DS_PROC_LIVE": uint64(ProcLive),
		"DS_PROC_REAPING": uint64(ProcReaping),
	}
	for name, v := range consts {
		fmt.Fprintf(&b, "printf(\"const.%s %%llu\\n\", (unsigned long long)(%s));\n", name, name)
		want["const."+name] = v
	}
	b.WriteString("return 0;\n}\n")
	bin := compileC(t, b.String())
	out, err := exec.Command(bin).Output()
	if err != nil {
		t.Fatalf("run ABI program: %v", err)
	}
	got := map[string]uint64{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		k, v, _ := strings.Cut(line, " ")
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("bad line %q", line)
		}
		got[k] = n
	}
	if len(got) != len(want) {
		t.Errorf("C printed %d values, Go expects %d", len(got), len(want))
	}
	var keys []string
	for k := range want {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if got[k] != want[k] {
			t.Errorf("%s: C says %d, Go says %d", k, got[k], want[k])
		}
	}
}

// TestABIEveryCFieldMirrored parses the struct bodies of detshare_table.h and checks that each C field has a Go
// field (the offset test alone would not notice a new C field hidden in what Go calls reserved space).
func TestABIEveryCFieldMirrored(t *testing.T) {
	src, err := os.ReadFile(headerPath(t))
	if err != nil {
		t.Fatal(err)
	}
	structRE := regexp.MustCompile(`(?s)struct (ds_[a-z_]+) \{(.*?)\n\};`)
	fieldRE := regexp.MustCompile(`(?m)^\s*(?:struct \w+|u?int\d+_t|char)\s+(\w+)(?:\[[^\]]*\])?;`)
	found := 0
	for _, m := range structRE.FindAllStringSubmatch(string(src), -1) {
		var goTyp reflect.Type
		for _, mi := range mirrors {
			if mi.cName == m[1] {
				goTyp = reflect.TypeOf(mi.goVal)
			}
		}
		if goTyp == nil {
			t.Errorf("C struct %s has no Go mirror", m[1])
			continue
		}
		found++
		tags := map[string]bool{}
		for i := 0; i < goTyp.NumField(); i++ {
			tags[goTyp.Field(i).Tag.Get("c")] = true
		}
		var cFields []string
		for _, f := range fieldRE.FindAllStringSubmatch(m[2], -1) {
			cFields = append(cFields, f[1])
			if !tags[f[1]] {
				t.Errorf("C field %s.%s has no Go mirror field", m[1], f[1])
			}
		}
		if len(cFields) != goTyp.NumField() {
			t.Errorf("%s: C has %d fields %v, Go %s has %d", m[1], len(cFields), cFields, goTyp.Name(), goTyp.NumField())
		}
	}
	if found != len(mirrors) {
		t.Errorf("found %d C structs, want %d", found, len(mirrors))
	}
}
