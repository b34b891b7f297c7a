package quota

import (
	"strings"
	"testing"

	"github.com/detshare/detshare/internal/table"
)

func FuzzParseMemory(f *testing.F) {
	for _, s := range []string{"0", "8Gi", "1.5G", "50%", "512MiB", "", "-1", "1e9", "99999999999999999999Ti", ".", "1..2G"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		m, err := ParseMemory(s)
		if err != nil {
			return
		}
		if m.Percent > 100 || (m.Percent != 0 && m.Bytes != 0) || m.Bytes > maxMemory {
			t.Fatalf("ParseMemory(%q) = %+v", s, m)
		}
		// What was accepted renders and parses back to the same value.
		if m2, err := ParseMemory(m.String()); err != nil || m2 != m {
			t.Fatalf("ParseMemory(%q) = %+v does not round-trip (%+v, %v)", s, m, m2, err)
		}
	})
}

func FuzzParseSMs(f *testing.F) {
	for _, s := range []string{"0", "8", "25%", "100%", "101%", "", "-3", "4294967296"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v, err := ParseSMs(s)
		if err != nil {
			return
		}
		if v.Percent > 100 || (v.Percent != 0 && v.Count != 0) || v.Count > maxSMs {
			t.Fatalf("ParseSMs(%q) = %+v", s, v)
		}
		if v2, err := ParseSMs(v.String()); err != nil || v2 != v {
			t.Fatalf("ParseSMs(%q) = %+v does not round-trip", s, v)
		}
	})
}

func FuzzResolve(f *testing.F) {
	f.Add("latency-critical", "50%", "8Gi", "env-tier", "3")
	f.Add("best-effort", "32", "0", "burstable", "0")
	f.Add("", "", "", "", "")
	f.Fuzz(func(t *testing.T, tier, sms, mem, envTier, weight string) {
		ann := map[string]string{}
		if tier != "" {
			ann["detshare.io/tier"] = tier
		}
		if sms != "" {
			ann["detshare.io/sms"] = sms
		}
		lab := map[string]string{"detshare.io/memory": mem}
		env := []string{"DETSHARE_TIER=" + envTier, "DETSHARE_WEIGHT=" + weight}
		q, err := Resolve(ann, lab, env, Default())
		if err != nil {
			if !strings.Contains(err.Error(), "(annotation)") && !strings.Contains(err.Error(), "(label)") &&
				!strings.Contains(err.Error(), "(env)") && !strings.Contains(err.Error(), "(default)") {
				t.Fatalf("error without a source: %v", err)
			}
			return
		}
		if err := q.Validate(); err != nil {
			t.Fatalf("Resolve returned an invalid quota: %v", err)
		}
		if q.Weight < 1 || q.Weight > 10000 {
			t.Fatalf("weight %d", q.Weight)
		}
		if q.Tier == table.TierBestEffort && !q.SMs.IsZero() {
			t.Fatalf("best-effort with SMs %+v", q.SMs)
		}
		if tier != "" && q.SourceOf(FieldTier) != SourceAnnotation {
			t.Fatalf("annotation tier lost to %s", q.SourceOf(FieldTier))
		}
	})
}

func FuzzParseFile(f *testing.F) {
	f.Add(string(Render(File{ID: "a", Slot: 1, SlotGen: 2,
		FilePaths: FilePaths{Table: "/run/detshare/table", ClientPage: "/run/detshare/client.page"}})))
	f.Add("version=1\nid=x\nslot=0\nslot_gen=0\ntier=best-effort\ntable=t\nclient_page=c\n# c\nzzz=1\n")
	f.Add("version=1\n=\n\x00\n")
	f.Fuzz(func(t *testing.T, data string) {
		q, err := ParseFile([]byte(data))
		if err != nil {
			return
		}
		if q.Validate() != nil {
			return // a value with a line break cannot come from a parsed line; NUL can, and is refused by Render's callers
		}
		q2, err := ParseFile(Render(q))
		if err != nil || q2 != q {
			t.Fatalf("parsed %+v does not round-trip: %+v %v", q, q2, err)
		}
	})
}
