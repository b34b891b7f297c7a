package quota

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// A misspelt key must refuse the container, naming the key, the likely intended key and the valid ones, whether
// it comes with valid keys or alone; DETSHARE_ variables that DetShare itself uses must pass.
func TestUnknownKeysRefuseWithTheValidKeys(t *testing.T) {
	for _, c := range []struct {
		name        string
		ann, labels map[string]string
		env         []string
		key, near   string
		src         Source
	}{
		{"env typo with valid keys", nil, nil, []string{"DETSHARE_TEIR=latency-critical", "DETSHARE_SMS=32"}, "DETSHARE_TEIR", "DETSHARE_TIER", SourceEnv},
		{"env typo alone", nil, nil, []string{"PATH=/bin", "DETSHARE_TEIR=burstable"}, "DETSHARE_TEIR", "DETSHARE_TIER", SourceEnv},
		{"annotation typo", map[string]string{"detshare.io/sm": "32", "detshare.io/tier": "burstable"}, nil, nil, "detshare.io/sm", "detshare.io/sms", SourceAnnotation},
		{"label unknown, no near key", nil, map[string]string{"detshare.io/colour": "red"}, nil, "detshare.io/colour", "", SourceLabel},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := CheckKeys(c.ann, c.labels, c.env)
			var fe *FieldError
			if !errors.As(err, &fe) {
				t.Fatalf("CheckKeys: want a *FieldError, got %v", err)
			}
			msg := err.Error()
			if fe.Key != c.key || fe.Source != c.src || !strings.Contains(msg, c.key) {
				t.Errorf("error %q: want key %s from %s", msg, c.key, c.src)
			}
			valid := "detshare.io/tier, detshare.io/sms"
			if c.src == SourceEnv {
				valid = "DETSHARE_TIER, DETSHARE_SMS"
			}
			if !strings.Contains(msg, "valid keys are "+valid) || !strings.Contains(msg, "slo") && !strings.Contains(msg, "SLO") {
				t.Errorf("error %q does not list the valid keys", msg)
			}
			if c.near != "" && !strings.Contains(msg, "did you mean "+c.near+"?") {
				t.Errorf("error %q does not suggest %s", msg, c.near)
			}
			if c.near == "" && strings.Contains(msg, "did you mean") {
				t.Errorf("error %q suggests a key for an unrelated name", msg)
			}
			// Resolution, the path every entry point takes to register, refuses too.
			if _, err := Resolve(c.ann, c.labels, c.env, Default()); !errors.As(err, &fe) || !strings.Contains(err.Error(), c.key) {
				t.Errorf("Resolve: want an error naming %s, got %v", c.key, err)
			}
		})
	}
	ok := []string{"DETSHARE_TIER=burstable", "DETSHARE_RUN_DIR=/run/detshare", "DETSHARE_LIB=/x", "DETSHARE_LOG_LEVEL=debug",
		"DETSHARE_FAIL_OPEN=1", "DETSHARE_SIMGPU_SMS=132", "DETSHARE_QUOTA_FILE=/q", "DETSHARE_LOG=info", "DETSHARE_TEST_X=1",
		"NOT_DETSHARE_TEIR=1"}
	if err := CheckKeys(map[string]string{"io.kubernetes.x": "1"}, nil, ok); err != nil {
		t.Errorf("valid keys and DetShare's own variables refused: %v", err)
	}
	if _, err := Resolve(nil, nil, ok, Default()); err != nil {
		t.Errorf("Resolve with DetShare's own variables: %v", err)
	}
}

// TestRuntimeEnvListsEveryVariableTheTreeReads: every DETSHARE_ name that the tree's code reads or sets (Go and C
// string literals, shell and make files) is a quota key or IsRuntimeEnv, so adding one without listing it here
// fails instead of refusing containers that carry it.
func TestRuntimeEnvListsEveryVariableTheTreeReads(t *testing.T) {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	files, err := exec.Command("git", "-C", root, "ls-files", "*.go", "*.c", "*.h", "*.sh", "*.py", "*.mk",
		"Makefile", "packaging/*", "configs/*").Output()
	if err != nil {
		t.Fatalf("git ls-files: %v", err)
	}
	// A quoted name, an assignment or an expansion; header guards (DETSHARE_..._H) are none of these.
	re := regexp.MustCompile(`(?:"|\$\{?|\b)(DETSHARE_[A-Z0-9_]*[A-Z0-9])(?:"|=|\}|\b)`)
	testRe := regexp.MustCompile(`(?:Getenv|LookupEnv)\("(DETSHARE_[A-Z0-9_]+)"\)`)
	known := map[string]bool{}
	for _, f := range Fields {
		known[f.EnvKey()] = true
	}
	missing := map[string]string{}
	for _, rel := range strings.Fields(string(files)) {
		if strings.HasPrefix(rel, "cgroupgpu/quota/") { // the rules and their examples of misspellings
			continue
		}
		data, err := os.ReadFile(filepath.Join(root, rel))
		if err != nil {
			t.Fatal(err)
		}
		// A line that says "misspelt on purpose" holds a wrong key a script feeds DetShare to see it refused.
		var kept []string
		for _, line := range strings.Split(string(data), "\n") {
			if !strings.Contains(line, "misspelt on purpose") {
				kept = append(kept, line)
			}
		}
		data = []byte(strings.Join(kept, "\n"))
		r := re
		if strings.HasSuffix(rel, "_test.go") { // tests make up names; what they read from the environment counts
			r = testRe
		}
		for _, m := range r.FindAllStringSubmatch(string(data), -1) {
			n := m[1]
			if strings.HasSuffix(n, "_H") || known[n] || IsRuntimeEnv(n) {
				continue
			}
			if _, seen := missing[n]; !seen {
				missing[n] = rel
			}
		}
	}
	for n, f := range missing {
		t.Errorf("%s (used in %s) is neither a quota key nor listed in runtimeEnv (keys.go): containers carrying it would be refused", n, f)
	}
}

func TestEditDistance(t *testing.T) {
	for _, c := range []struct {
		a, b string
		d    int
	}{{"DETSHARE_TEIR", "DETSHARE_TIER", 1}, {"sm", "sms", 1}, {"abc", "abc", 0}, {"colour", "tier", 5}} {
		if d := editDistance(c.a, c.b); d != c.d {
			t.Errorf("editDistance(%q, %q) = %d, want %d", c.a, c.b, d, c.d)
		}
	}
}
