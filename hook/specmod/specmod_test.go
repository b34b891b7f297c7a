package specmod

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/detshare/detshare/internal/table"
)

// A spec with fields no runtime-spec version knows, at the top level and nested, and a number that float64 rounds.
const specWithUnknown = `{
  "ociVersion": "1.2.0",
  "process": {"args": ["sh"], "env": ["PATH=/bin", "A=1"], "futureProcessField": {"x": [1, 2]},
              "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 18446744073709551615, "soft": 1024}]},
  "root": {"path": "rootfs", "readonly": true},
  "mounts": [{"destination": "/proc", "type": "proc", "source": "proc", "futureMountField": true}],
  "hooks": {"createRuntime": [{"path": "/usr/bin/other", "args": ["other"]}]},
  "annotations": {"keep": "me"},
  "linux": {"memoryPolicy": {"mode": "MPOL_BIND", "nodes": "0"}, "netDevices": {"eth9": {}}},
  "someFutureTopLevel": {"deep": {"deeper": "value"}}
}`

func writeSpec(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "config.json")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func decode(t *testing.T, path string) map[string]any {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	d := json.NewDecoder(strings.NewReader(string(data)))
	d.UseNumber()
	if err := d.Decode(&m); err != nil {
		t.Fatal(err)
	}
	return m
}

func testTenant(dir string) Tenant {
	return Tenant{ID: "c1", RunDir: dir, LibPath: "/usr/lib/detshare/libdetshare.so",
		PreloadFile: filepath.Join(dir, "ld.so.preload"), QuotaFile: filepath.Join(dir, "tenants/c1/container-quota"),
		HookPath: "/usr/bin/detshare-hook"}
}

func TestUnknownFieldsSurviveTenantEdit(t *testing.T) {
	p := writeSpec(t, specWithUnknown)
	if err := ModifyFile(p, ForTenant(testTenant("/run/detshare"))); err != nil {
		t.Fatal(err)
	}
	m := decode(t, p)
	if m["someFutureTopLevel"].(map[string]any)["deep"].(map[string]any)["deeper"] != "value" {
		t.Errorf("unknown top-level field lost: %v", m["someFutureTopLevel"])
	}
	proc := m["process"].(map[string]any)
	if _, ok := proc["futureProcessField"]; !ok {
		t.Error("unknown process field lost")
	}
	hard := proc["rlimits"].([]any)[0].(map[string]any)["hard"].(json.Number)
	if hard.String() != "18446744073709551615" {
		t.Errorf("uint64 rlimit changed to %s", hard)
	}
	if _, ok := m["linux"].(map[string]any)["memoryPolicy"]; !ok {
		t.Error("linux.memoryPolicy lost")
	}
	if m["mounts"].([]any)[0].(map[string]any)["futureMountField"] != true {
		t.Error("unknown field of an existing mount lost")
	}
	if m["root"].(map[string]any)["readonly"] != true {
		t.Error("root.readonly lost")
	}
	if m["annotations"].(map[string]any)["keep"] != "me" {
		t.Error("existing annotation lost")
	}
}

func TestForTenantAddsMountsHookAnnotationIdempotently(t *testing.T) {
	p := writeSpec(t, specWithUnknown)
	tn := testTenant("/run/detshare")
	tn.MPSPipeDir = "/run/detshare/mps/gpu0/pipe"
	for i := 0; i < 2; i++ { // twice: a retried create must not duplicate anything
		if err := ModifyFile(p, ForTenant(tn)); err != nil {
			t.Fatal(err)
		}
	}
	s, err := Load(p)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]struct {
		src string
		rw  bool
	}{
		table.ContainerLibPath:        {"/usr/lib/detshare/libdetshare.so", false},
		table.ContainerLdPreloadPath:  {"/run/detshare/ld.so.preload", false},
		table.ContainerQuotaPath:      {"/run/detshare/tenants/c1/container-quota", false},
		table.ContainerTablePath:      {"/run/detshare/table", false},
		table.ContainerClientPagePath: {"/run/detshare/clients/c1.page", true},
		table.ContainerDoorbellPath:   {"/run/detshare/doorbell", true},
		table.ContainerMPSPipeDir:     {"/run/detshare/mps/gpu0/pipe", false},
	}
	seen := map[string]int{}
	for _, m := range s.Mounts() {
		seen[m.Destination]++
		w, ok := want[m.Destination]
		if !ok {
			continue
		}
		if m.Source != w.src || m.Type != "bind" {
			t.Errorf("mount %s: source %q type %q, want %q bind", m.Destination, m.Source, m.Type, w.src)
		}
		opts := strings.Join(m.Options, ",")
		if w.rw != strings.Contains(opts, "rw") || w.rw == strings.Contains(opts, "ro") {
			t.Errorf("mount %s options %s, want rw=%v", m.Destination, opts, w.rw)
		}
	}
	for d := range want {
		if seen[d] != 1 {
			t.Errorf("mount %s present %d times, want once", d, seen[d])
		}
	}
	post := s.Hooks("poststop")
	if len(post) != 1 || post[0].Path != "/usr/bin/detshare-hook" ||
		strings.Join(post[0].Args, " ") != "detshare-hook --run-dir /run/detshare poststop --id c1" {
		t.Errorf("poststop hooks = %+v", post)
	}
	if cr := s.Hooks("createRuntime"); len(cr) != 1 || cr[0].Path != "/usr/bin/other" {
		t.Errorf("existing createRuntime hook changed: %+v", cr)
	}
	if s.Annotations()[TenantIDAnnotation] != "c1" {
		t.Errorf("annotation %s missing", TenantIDAnnotation)
	}
}

func TestAddMountReplacesSameDestination(t *testing.T) {
	s, err := Parse([]byte(`{"mounts":[{"destination":"/etc/ld.so.preload","type":"bind","source":"/image/own"},{"destination":"/etc/ld.so.preload/","source":"/again"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if err := AddMounts(BindMount("/ours", "/etc/ld.so.preload", false)).Modify(s); err != nil {
		t.Fatal(err)
	}
	ms := s.Mounts()
	if len(ms) != 1 || ms[0].Source != "/ours" {
		t.Fatalf("mounts = %+v, want one mount from /ours", ms)
	}
}

func TestBadInputNamesFieldAndLeavesFileUnchanged(t *testing.T) {
	cases := []struct {
		name, spec string
		mod        Modifier
		wantErr    string
	}{
		{"mounts not array", `{"mounts": {"a": 1}}`, AddMounts(BindMount("/a", "/b", false)), `"mounts"`},
		{"relative destination", `{}`, AddMounts(BindMount("/a", "rel", false)), `"rel"`},
		{"bad stage", `{}`, AddHook("preStart", Hook{Path: "/x"}), "allowed stages are prestart, createRuntime"},
		{"relative hook", `{}`, AddHook("poststop", Hook{Path: "x"}), `hook path "x"`},
		{"hooks not object", `{"hooks": []}`, AddHook("poststop", Hook{Path: "/x"}), `"hooks"`},
		{"annotations not object", `{"annotations": "x"}`, SetAnnotations(map[string]string{"a": "b"}), `"annotations"`},
		{"env key", `{}`, SetEnv("A=B", "c"), `env key "A=B"`},
		{"bad tenant id", `{}`, ForTenant(Tenant{ID: "../x", RunDir: "/r", LibPath: "/l", PreloadFile: "/p", QuotaFile: "/q"}), `"../x"`},
		{"relative lib", `{}`, ForTenant(Tenant{ID: "x", RunDir: "/r", LibPath: "lib.so", PreloadFile: "/p", QuotaFile: "/q"}), `library "lib.so"`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := writeSpec(t, c.spec)
			err := ModifyFile(p, c.mod)
			if err == nil || !strings.Contains(err.Error(), c.wantErr) {
				t.Fatalf("err = %v, want it to mention %s", err, c.wantErr)
			}
			data, _ := os.ReadFile(p)
			if string(data) != c.spec {
				t.Errorf("file changed on error: %s", data)
			}
			ents, _ := os.ReadDir(filepath.Dir(p))
			if len(ents) != 1 {
				t.Errorf("directory has %d entries after failed edit, want only config.json", len(ents))
			}
		})
	}
	if _, err := Parse([]byte(`null`)); err == nil {
		t.Error("null spec accepted")
	}
	if _, err := Parse([]byte(`{"a":`)); err == nil {
		t.Error("truncated spec accepted")
	}
}

func TestWriteFileAtomicKeepsModeAndLeavesNoTemp(t *testing.T) {
	p := writeSpec(t, `{"ociVersion":"1.0.2"}`)
	if err := os.Chmod(p, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := ModifyFile(p, SetEnv("DETSHARE_X", "1"), SetEnv("DETSHARE_X", "2")); err != nil {
		t.Fatal(err)
	}
	st, _ := os.Stat(p)
	if st.Mode().Perm() != 0o600 {
		t.Errorf("mode = %v, want 0600", st.Mode().Perm())
	}
	s, _ := Load(p)
	if env := s.Env(); len(env) != 1 || env[0] != "DETSHARE_X=2" {
		t.Errorf("env = %v, want [DETSHARE_X=2]", env)
	}
	ents, _ := os.ReadDir(filepath.Dir(p))
	if len(ents) != 1 {
		t.Errorf("%d entries in bundle, want 1 (no temporary left)", len(ents))
	}
	// A directory that cannot take the temporary file: the original stays as it was.
	ro := t.TempDir()
	q := filepath.Join(ro, "config.json")
	os.WriteFile(q, []byte(`{}`), 0o644)
	os.Chmod(ro, 0o500)
	defer os.Chmod(ro, 0o700)
	if os.Geteuid() != 0 { // root ignores directory permissions
		if err := ModifyFile(q, SetEnv("A", "b")); err == nil {
			t.Error("write into a read-only directory succeeded")
		}
	}
}

func BenchmarkModifyFileForTenant(b *testing.B) {
	dir := b.TempDir()
	p := filepath.Join(dir, "config.json")
	for i := 0; i < b.N; i++ {
		os.WriteFile(p, []byte(specWithUnknown), 0o644)
		if err := ModifyFile(p, ForTenant(testTenant("/run/detshare"))); err != nil {
			b.Fatal(err)
		}
	}
}

// FuzzForTenant: any spec either is refused or comes out as valid JSON that keeps every top-level key and carries
// the tenant's mounts once.
func FuzzForTenant(f *testing.F) {
	f.Add([]byte(specWithUnknown))
	f.Add([]byte(`{}`))
	f.Add([]byte(`{"mounts":null,"hooks":{"poststop":null}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := Parse(data)
		if err != nil {
			return
		}
		keys := map[string]bool{}
		for k := range s.m {
			keys[k] = true
		}
		if err := ForTenant(testTenant("/run/detshare")).Modify(s); err != nil {
			return
		}
		out, err := s.Bytes()
		if err != nil {
			t.Fatal(err)
		}
		again, err := Parse(out)
		if err != nil {
			t.Fatalf("output does not parse: %v", err)
		}
		for k := range keys {
			if _, ok := again.m[k]; !ok {
				t.Fatalf("top-level key %q lost", k)
			}
		}
		n := 0
		for _, m := range again.Mounts() {
			if m.Destination == table.ContainerQuotaPath {
				n++
			}
		}
		if n != 1 {
			t.Fatalf("quota mount present %d times", n)
		}
	})
}
