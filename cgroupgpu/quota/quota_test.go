package quota

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/detshare/detshare/internal/table"
)

func TestParseMemory(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Memory
	}{
		{"0", Memory{}}, {"1", Memory{Bytes: 1}}, {"1024", Memory{Bytes: 1024}}, {"8Gi", Memory{Bytes: 8 << 30}},
		{"8GiB", Memory{Bytes: 8 << 30}}, {"1.5Gi", Memory{Bytes: 3 << 29}}, {"512Mi", Memory{Bytes: 512 << 20}},
		{"2G", Memory{Bytes: 2e9}}, {"2GB", Memory{Bytes: 2e9}}, {"10k", Memory{Bytes: 10000}}, {"1Ti", Memory{Bytes: 1 << 40}},
		{" 4Ki ", Memory{Bytes: 4096}}, {"50%", Memory{Percent: 50}}, {"100%", Memory{Percent: 100}},
		{"4096B", Memory{Bytes: 4096}},
	} {
		got, err := ParseMemory(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("ParseMemory(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
	}
	for _, in := range []string{"", "-1", "1.5.5G", "G", "8gb", "8 X", "0%", "101%", "abc", ".5G", "5.G", "99999999999Ti", "0.1"} {
		if m, err := ParseMemory(in); err == nil {
			t.Errorf("ParseMemory(%q) = %+v, want an error", in, m)
		}
	}
}

func TestParseSMs(t *testing.T) {
	for in, want := range map[string]SMs{"0": {}, "8": {Count: 8}, "132": {Count: 132}, "25%": {Percent: 25}, "100%": {Percent: 100}} {
		if got, err := ParseSMs(in); err != nil || got != want {
			t.Errorf("ParseSMs(%q) = %+v %v", in, got, err)
		}
	}
	for _, in := range []string{"", "-1", "0%", "101%", "200%", "x", "1.5", "65537"} {
		if _, err := ParseSMs(in); err == nil {
			t.Errorf("ParseSMs(%q) accepted", in)
		}
	}
}

func TestOtherParsers(t *testing.T) {
	if tier, err := ParseTier("Latency-Critical"); err != nil || tier != table.TierLatencyCritical {
		t.Errorf("tier: %v %v", tier, err)
	}
	if _, err := ParseTier("gold"); err == nil || !strings.Contains(err.Error(), "latency-critical, burstable, best-effort") {
		t.Errorf("bad tier: %v", err)
	}
	if w, err := ParseWeight("10000"); err != nil || w != 10000 {
		t.Errorf("weight: %v", err)
	}
	for _, in := range []string{"0", "10001", "-1", "x"} {
		if _, err := ParseWeight(in); err == nil {
			t.Errorf("weight %q accepted", in)
		}
	}
	for in, want := range map[string]GPUSelector{"auto": {Auto: true}, "3": {Index: 3}, "GPU-abc": {UUID: "GPU-abc"}, "SIM-1": {UUID: "SIM-1"}} {
		if g, err := ParseGPU(in); err != nil || g != want {
			t.Errorf("gpu %q: %+v %v", in, g, err)
		}
	}
	for _, in := range []string{"16", "-1", "MIG-x", "first", ""} {
		if _, err := ParseGPU(in); err == nil {
			t.Errorf("gpu %q accepted", in)
		}
	}
	if r, err := ParseRole("decode"); err != nil || r != table.RoleDecode {
		t.Error("role decode")
	}
	if _, err := ParseRole("encode"); err == nil {
		t.Error("role encode accepted")
	}
	if l, err := ParseLend("yes"); err != nil || !l {
		t.Error("lend yes")
	}
	if _, err := ParseLend("maybe"); err == nil {
		t.Error("lend maybe accepted")
	}
}

func TestResolvePrecedence(t *testing.T) {
	ann := map[string]string{"detshare.io/tier": "latency-critical"}
	lab := map[string]string{"detshare.io/tier": "burstable", "detshare.io/sms": "32", "detshare.io/memory": "8Gi"}
	env := []string{"DETSHARE_TIER=best-effort", "DETSHARE_SMS=16", "DETSHARE_MEMORY=1Gi", "DETSHARE_WEIGHT=4", "PATH=/bin"}
	def := Default()
	def.Role = table.RolePrefill
	q, err := Resolve(ann, lab, env, def)
	if err != nil {
		t.Fatal(err)
	}
	for f, want := range map[Field]Source{FieldTier: SourceAnnotation, FieldSMs: SourceLabel, FieldMemory: SourceLabel,
		FieldWeight: SourceEnv, FieldRole: SourceDefault, FieldGPU: SourceDefault} {
		if got := q.SourceOf(f); got != want {
			t.Errorf("source of %s = %s, want %s", f, got, want)
		}
	}
	if q.Tier != table.TierLatencyCritical || q.SMs.Count != 32 || q.Memory.Bytes != 8<<30 || q.Weight != 4 || q.Role != table.RolePrefill || !q.GPU.Auto {
		t.Errorf("resolved %+v", q)
	}
	// Each layer alone.
	for _, tc := range []struct {
		ann, lab map[string]string
		env      []string
		want     table.Tier
		src      Source
	}{
		{nil, nil, nil, table.TierBestEffort, SourceDefault},
		{nil, nil, []string{"DETSHARE_TIER=burstable"}, table.TierBurstable, SourceEnv},
		{nil, map[string]string{"detshare.io/tier": "burstable"}, []string{"DETSHARE_TIER=best-effort"}, table.TierBurstable, SourceLabel},
		{map[string]string{"detshare.io/tier": "best-effort"}, map[string]string{"detshare.io/tier": "burstable"}, nil, table.TierBestEffort, SourceAnnotation},
	} {
		q, err := Resolve(tc.ann, tc.lab, tc.env, Default())
		if err != nil || q.Tier != tc.want || q.SourceOf(FieldTier) != tc.src {
			t.Errorf("%+v: %s from %s (%v)", tc, q.Tier, q.SourceOf(FieldTier), err)
		}
	}
	// Flags beat annotations.
	q, err = ResolveInputs(Inputs{Flags: map[Field]string{FieldTier: "burstable"}, Annotations: ann})
	if err != nil || q.Tier != table.TierBurstable || q.SourceOf(FieldTier) != SourceFlag {
		t.Errorf("flags: %+v %v", q, err)
	}
	// The env later entry wins, as execve does.
	q, _ = Resolve(nil, nil, []string{"DETSHARE_WEIGHT=2", "DETSHARE_WEIGHT=5"}, Default())
	if q.Weight != 5 {
		t.Errorf("duplicate env: weight %d", q.Weight)
	}
}

func TestResolveErrorsNameFieldValueSource(t *testing.T) {
	for _, tc := range []struct {
		ann  map[string]string
		env  []string
		flag map[Field]string
		want []string
	}{
		{map[string]string{"detshare.io/sms": "200%"}, nil, nil, []string{`detshare.io/sms="200%" (annotation): percent must be in 1..100`}},
		{nil, []string{"DETSHARE_TIER=gold"}, nil, []string{`DETSHARE_TIER="gold" (env)`, "latency-critical, burstable, best-effort"}},
		{nil, nil, map[Field]string{FieldMemory: "lots"}, []string{`--memory="lots" (flag)`, "Ki, Mi, Gi"}},
		{map[string]string{"detshare.io/tier": "best-effort", "detshare.io/sms": "32"}, nil, nil,
			[]string{`detshare.io/sms="32" (annotation)`, "best-effort tenant has no guaranteed SMs"}},
		{map[string]string{"detshare.io/tier": "latency-critical"}, nil, nil, []string{"latency-critical tenant needs guaranteed SMs"}},
		{map[string]string{"detshare.io/lend": "true", "detshare.io/tier": "burstable"}, nil, nil, []string{"lending applies only to tier latency-critical"}},
		// Several bad fields are reported together.
		{map[string]string{"detshare.io/weight": "0", "detshare.io/role": "encode"}, nil, nil,
			[]string{`detshare.io/weight="0" (annotation)`, `detshare.io/role="encode" (annotation)`}},
	} {
		_, err := ResolveInputs(Inputs{Annotations: tc.ann, Env: tc.env, Flags: tc.flag})
		if err == nil {
			t.Errorf("%+v accepted", tc)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("error %q does not contain %q", err, w)
			}
		}
		var fe *FieldError
		if !errors.As(err, &fe) {
			t.Errorf("error %v is not a *FieldError", err)
		}
	}
}

func TestDefaultsSMsIgnoredForBestEffort(t *testing.T) {
	def := Default()
	def.SMs = SMs{Count: 16}
	q, err := Resolve(nil, nil, nil, def)
	if err != nil || !q.SMs.IsZero() {
		t.Fatalf("default SMs on best-effort: %+v %v", q.SMs, err)
	}
	q, err = Resolve(map[string]string{"detshare.io/tier": "burstable"}, nil, nil, def)
	if err != nil || q.SMs.Count != 16 {
		t.Fatalf("default SMs on burstable: %+v %v", q.SMs, err)
	}
}

func TestHasDetShareSettingsAndUnknownKeys(t *testing.T) {
	if (Inputs{Annotations: map[string]string{"io.kubernetes.x": "1"}, Env: []string{"PATH=/bin", "DETSHARE_RUN_DIR=/x"}}).Resolve().Asked {
		t.Error("no settings reported as present")
	}
	if !(Inputs{Env: []string{"DETSHARE_TIER=burstable"}}).Resolve().Asked || !(Inputs{Labels: map[string]string{"detshare.io/gpu": "0"}}).Resolve().Asked {
		t.Error("settings not found")
	}
	if u := UnknownKeys(map[string]string{"detshare.io/tiers": "x", "detshare.io/tier": "y"}, nil, nil); len(u) != 1 || u[0].Key != "detshare.io/tiers" {
		t.Errorf("unknown keys %v", u)
	}
}

func h100() table.GPUState {
	return table.GPUState{GPUInfo: table.GPUInfo{Index: 0, UUID: "SIM-0", SMCount: 132, MemTotal: 80 << 30},
		Split: table.EstimateSplit(132, 8)}
}

func TestRoundAndPlace(t *testing.T) {
	g := h100()
	for _, tc := range []struct {
		sms            string
		groups, gotSMs uint32
	}{{"1", 1, 8}, {"8", 1, 8}, {"9", 2, 16}, {"32", 4, 32}, {"50%", 9, 72}, {"120", 15, 120}} {
		q, err := Resolve(map[string]string{"detshare.io/tier": "burstable", "detshare.io/sms": tc.sms}, nil, nil, Default())
		if err != nil {
			t.Fatal(err)
		}
		p, err := q.Place(g)
		if err != nil || p.Groups != tc.groups || p.SMs != tc.gotSMs {
			t.Errorf("sms %s: %+v %v, want %d groups %d SMs", tc.sms, p, err, tc.groups, tc.gotSMs)
		}
	}
	q, _ := Resolve(map[string]string{"detshare.io/tier": "burstable", "detshare.io/sms": "100%"}, nil, nil, Default())
	if _, err := q.Place(g); err == nil || !strings.Contains(err.Error(), `detshare.io/sms="100%" (annotation)`) ||
		!strings.Contains(err.Error(), "12 SMs are left over") {
		t.Errorf("132 SMs on a 15x8 split: %v", err)
	}
	q, _ = Resolve(map[string]string{"detshare.io/memory": "25%"}, nil, nil, Default())
	if p, err := q.Place(g); err != nil || p.MemLimit != 20<<30 {
		t.Errorf("25%% memory: %+v %v", p, err)
	}
	q, _ = Resolve(map[string]string{"detshare.io/memory": "81Gi"}, nil, nil, Default())
	if _, err := q.Place(g); err == nil || !strings.Contains(err.Error(), "more than GPU 0") {
		t.Errorf("81Gi on 80Gi: %v", err)
	}
}

func TestAdmit(t *testing.T) {
	g := h100() // 15 groups, 80 GiB
	existing := ExistingOf(
		Registered{ID: "lc", GPU: 0, Tier: table.TierLatencyCritical, Groups: 8, SMs: 64, Memory: 40 << 30},
		Registered{ID: "bu", GPU: 0, Tier: table.TierBurstable, Groups: 4, SMs: 32},
		Registered{ID: "be", GPU: 0, Tier: table.TierBestEffort, Memory: 30 << 30},
		Registered{ID: "other-gpu", GPU: 1, Tier: table.TierLatencyCritical, Groups: 15, Memory: 80 << 30},
	)
	for _, tc := range []struct {
		name string
		tier table.Tier
		p    Placement
		want string // "" = admitted
	}{
		{"fits exactly", table.TierBurstable, Placement{Groups: 3, SMs: 24}, ""},
		{"one group too many", table.TierLatencyCritical, Placement{Groups: 4, SMs: 32}, `asks 4 SM groups (32 SMs) but 12 of the 15 groups are guaranteed to others ["lc" 8 groups/64 SMs (latency-critical), "bu" 4 groups/32 SMs (burstable)]; 3 free`},
		{"best-effort needs no groups", table.TierBestEffort, Placement{}, ""},
		{"memory fits", table.TierBestEffort, Placement{MemLimit: 10 << 30}, ""},
		{"memory too much", table.TierBestEffort, Placement{MemLimit: 10<<30 + 1}, `reserved by others ["lc" 40Gi, "be" 30Gi]`},
		{"unlimited memory reserves nothing", table.TierBestEffort, Placement{MemLimit: 0}, ""},
	} {
		err := Admit(g, existing, "new", tc.tier, tc.p)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: refused: %v", tc.name, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: error %v, want %q", tc.name, err, tc.want)
		case tc.want != "":
			var ae *AdmissionError
			if !errors.As(err, &ae) || !strings.Contains(err.Error(), `admission refused for "new" on GPU 0 (SIM-0)`) {
				t.Errorf("%s: %v", tc.name, err)
			}
		}
	}
}

func TestQuotaFileRoundTrip(t *testing.T) {
	f := File{Version: 1, ID: "abc", Slot: 3, SlotGen: 7, GPU: 1,
		FilePaths: FilePaths{Table: "/run/detshare/table", ClientPage: "/run/detshare/client.page",
			Doorbell: "/run/detshare/doorbell", MPSPipeDir: ""}}
	data := Render(f)
	// Exactly the keys libdetshare reads (ds_tenant.c read_quota_file), in this order: tier, SMs, memory, weight
	// and role are the registration's, not the file's.
	var keys []string
	for _, line := range strings.Split(strings.TrimSuffix(string(data), "\n"), "\n") {
		if !strings.HasPrefix(line, "#") {
			k, _, _ := strings.Cut(line, "=")
			keys = append(keys, k)
		}
	}
	if want := "version id slot slot_gen gpu table client_page doorbell mps_pipe_dir"; strings.Join(keys, " ") != want {
		t.Errorf("rendered keys %q, want %q:\n%s", keys, want, data)
	}
	for _, line := range []string{"version=1\n", "id=abc\n", "slot=3\n", "slot_gen=7\n", "gpu=1\n",
		"table=/run/detshare/table\n", "client_page=/run/detshare/client.page\n", "doorbell=/run/detshare/doorbell\n",
		"mps_pipe_dir=\n"} {
		if !strings.Contains(string(data), line) {
			t.Errorf("rendered file lacks %q:\n%s", line, data)
		}
	}
	got, err := ParseFile(append(data, []byte("# comment\nfuture_key=1\n")...))
	if err != nil || got != f {
		t.Fatalf("round trip: %+v %v", got, err)
	}
	// A file written before the format was cut to what the library reads still parses: its extra keys are ignored.
	old := "version=1\nid=a\nslot=0\nslot_gen=1\ntier=burstable\nsms=16\nmemory=1024\nweight=2\nrole=decode\ntable=x\nclient_page=y\n"
	if got, err := ParseFile([]byte(old)); err != nil || got.ID != "a" || got.Table != "x" || got.ClientPage != "y" {
		t.Errorf("older file: %+v %v", got, err)
	}
	if err := (File{ID: "a\nslot=9"}).Validate(); err == nil || !strings.Contains(err.Error(), "line breaks") {
		t.Errorf("a value with a line break validated: %v", err)
	}
	if err := f.Validate(); err != nil {
		t.Error(err)
	}
	for _, bad := range []string{"version=2\nid=a\nslot=0\nslot_gen=1\ntable=x\nclient_page=y\n",
		"id=a\n", "version=1\nnot a pair\n", "version=1\nid=a\nslot=x\n",
		"version=1\nid=a\nslot=0\nslot_gen=1\ntable=x\n"} {
		if _, err := ParseFile([]byte(bad)); err == nil {
			t.Errorf("accepted %q", bad)
		}
	}
}

func TestPinnedAndSLOKeys(t *testing.T) {
	q, err := Resolve(map[string]string{"detshare.io/tier": "latency-critical", "detshare.io/sms": "32",
		"detshare.io/pinned": "true"}, nil, []string{"DETSHARE_SLO_P99=5ms"}, Default())
	if err != nil {
		t.Fatal(err)
	}
	if !q.Pinned || q.SLOP99 != 5*time.Millisecond || q.SourceOf(FieldSLOP99) != SourceEnv {
		t.Fatalf("pinned %v slo %v (%s)", q.Pinned, q.SLOP99, q.SourceOf(FieldSLOP99))
	}
	for _, c := range []struct {
		ann  map[string]string
		want []string
	}{
		{map[string]string{"detshare.io/tier": "latency-critical", "detshare.io/sms": "32", "detshare.io/slo-p99": "fast"},
			[]string{"detshare.io/slo-p99", `"fast"`, "100us to 60s"}},
		{map[string]string{"detshare.io/tier": "latency-critical", "detshare.io/sms": "32", "detshare.io/slo-p99": "10us"},
			[]string{"detshare.io/slo-p99", "100us to 60s"}},
		{map[string]string{"detshare.io/tier": "best-effort", "detshare.io/slo-p99": "5ms"},
			[]string{"detshare.io/slo-p99", "only to tier latency-critical"}},
		{map[string]string{"detshare.io/tier": "burstable", "detshare.io/sms": "16", "detshare.io/pinned": "true"},
			[]string{"detshare.io/pinned", "only to tier latency-critical"}},
		{map[string]string{"detshare.io/tier": "latency-critical", "detshare.io/sms": "32", "detshare.io/pinned": "sometimes"},
			[]string{"detshare.io/pinned", "true, false"}},
	} {
		_, err := Resolve(c.ann, nil, nil, Default())
		if err == nil {
			t.Fatalf("%v: accepted", c.ann)
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%v: error %q does not name %q", c.ann, err, w)
			}
		}
	}
	if FieldSLOP99.EnvKey() != "DETSHARE_SLO_P99" {
		t.Fatalf("env key %s", FieldSLOP99.EnvKey())
	}
}

// TestTierAndRoleNamesAreTheTables: quota keys parse into internal/table's Tier and Role, spelled as the table names
// the C enum values, so the keys agree with `detshare status`, the config and the scheduler's logs.
func TestTierAndRoleNamesAreTheTables(t *testing.T) {
	for _, tier := range []table.Tier{table.TierBestEffort, table.TierBurstable, table.TierLatencyCritical} {
		if got, err := ParseTier(" " + strings.ToUpper(tier.String())); err != nil || got != tier {
			t.Errorf("ParseTier(%q) = %q, %v", tier, got, err)
		}
	}
	if lc, _ := ParseTier("latency-critical"); lc != table.TierLatencyCritical {
		t.Error("table values")
	}
	if dec, _ := ParseRole("decode"); dec != table.RoleDecode {
		t.Error("table values")
	}
	for _, role := range []table.Role{table.RoleNone, table.RolePrefill, table.RoleDecode} {
		if got, err := ParseRole(" " + strings.ToUpper(role.String())); err != nil || got != role {
			t.Errorf("role %q parses to %q, %v", role, got, err)
		}
	}
	if _, err := ParseTier("gold"); err == nil || !strings.Contains(err.Error(), "latency-critical") {
		t.Errorf("unknown tier: %v", err)
	}
	if r, err := ParseRole(""); err != nil || r != table.RoleNone {
		t.Errorf("empty role: %q %v", r, err)
	}
}
