package quota

import (
	"errors"
	"fmt"
	"sort"
	"strings"
)

// Unknown keys. A DETSHARE_* variable or detshare.io/* annotation or label that is neither a quota key nor one of
// the settings below is a mistake (DETSHARE_TEIR, detshare.io/sm): the prefixes are DetShare's, so whoever wrote it
// meant to ask DetShare for something. Ignoring it would run the container unshared, or with a quota it did not ask
// for, and nobody would notice; so every entry point (shim, runc wrapper, hook, `detshare run`) refuses the
// container, naming the key and listing the valid ones (CheckKeys, Inputs.Resolve), whether or not it also has valid
// keys.

// runtimeEnv are DETSHARE_ variables that are not quota keys: DetShare sets or reads them at run time (the
// binaries, libdetshare in the container, the engines' configuration), so they may be in any container's or
// shell's environment. A new one must be added here (TestRuntimeEnvListsEveryVariableTheTreeReads keeps this true).
var runtimeEnv = map[string]bool{
	// daemon, binaries and installer
	"DETSHARE_RUN_DIR": true, "DETSHARE_LIB": true, "DETSHARE_HOOK": true, "DETSHARE_RUNC": true,
	"DETSHARE_CONFIG": true, "DETSHARE_LOG_LEVEL": true, "DETSHARE_FAIL_OPEN": true, "DETSHARE_FAIL_CLOSED": true,
	"DETSHARE_DOCKER_CONFIG": true, "DETSHARE_CONTAINERD_CONFIG": true, "DETSHARE_CONTAINERD_DROPIN": true,
	"DETSHARE_DEVICE_PLUGIN_DIR": true, "DETSHARE_SHIM_LABELS": true, "DETSHARE_SIMULATED_GPU": true,
	"DETSHARE_FORCE_REMOVE": true, "DETSHARE_HOST_ROOT": true, "DETSHARE_DEPS_YES": true,
	"DETSHARE_MAX_WEIGHT": true, "DETSHARE_ALLOWED_ROLES": true, "DETSHARE_DRA_DEVICES": true, "DETSHARE_DEVICE_TAINTS": true,
	"DETSHARE_DEVICE_PLUGIN_GPUS": true, "DETSHARE_DEVICE_PLUGIN_READY_FILE": true, "DETSHARE_DEVICE_METADATA": true,
	"DETSHARE_XID_IGNORED": true, "DETSHARE_XID_HOLD": true, "DETSHARE_UNHEALTHY_EFFECT": true, "DETSHARE_NODE_CONDITION": true,
	// set in the tenant by DetShare, read by libdetshare
	"DETSHARE_QUOTA_FILE": true, "DETSHARE_TENANT": true, "DETSHARE_CLIENT_PAGE_SOCK": true, "DETSHARE_LOG": true,
	"DETSHARE_STRICT_STREAMS": true, "DETSHARE_MPS_PRIORITY": true, "DETSHARE_REAL_LIBCUDA": true,
	"DETSHARE_IDLE_MS": true, "DETSHARE_GRANT_WAIT_MS": true, "DETSHARE_FIRST_GRANT_WAIT_MS": true,
	"DETSHARE_TOKEN_WAIT_MS": true, "DETSHARE_SCHED_STALE_MS": true, "DETSHARE_CONFINE_FULL_CAPTURE": true,
	// the test suites and benchmarks (`detshare run` passes the shell's environment on)
	"DETSHARE_BIN": true, "DETSHARE_BUILD_DIR": true, "DETSHARE_K8S_CACHE": true, "DETSHARE_CONTAINERD_BIN": true,
	"DETSHARE_TORCH_PYTHON": true, "DETSHARE_DAEMON_TEST_ROLE": true, "DETSHARE_LIB_DIR": true,
	"DETSHARE_OLD_GLIBC_ROOT": true, "DETSHARE_K8S_VERSION": true,
}

// runtimeEnvPrefixes are families of such variables: the simulated GPU (a test double) and the test suites.
var runtimeEnvPrefixes = []string{"DETSHARE_SIMGPU", "DETSHARE_TEST_", "DETSHARE_SKIP_", "DETSHARE_BENCH_",
	"DETSHARE_E2E_"}

// IsRuntimeEnv tells whether name is a DETSHARE_ variable DetShare uses other than a quota key.
func IsRuntimeEnv(name string) bool {
	if runtimeEnv[name] {
		return true
	}
	for _, p := range runtimeEnvPrefixes {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// UnknownKey is one key with a DetShare prefix that DetShare does not know.
type UnknownKey struct {
	Key    string
	Value  string
	Source Source // SourceAnnotation, SourceLabel or SourceEnv
}

// UnknownKeys returns the detshare.io/ annotation and label keys that are not quota fields and the DETSHARE_
// environment variables that are neither quota keys nor runtime settings (IsRuntimeEnv), sorted by key.
func UnknownKeys(annotations, labels map[string]string, env []string) []UnknownKey {
	return unknownKeys(annotations, labels, envMap(env))
}

func unknownKeys(annotations, labels, envm map[string]string) []UnknownKey {
	known := map[string]bool{}
	for _, f := range Fields {
		known[f.AnnotationKey()] = true
		known[f.EnvKey()] = true
	}
	var out []UnknownKey
	for _, m := range []struct {
		kv  map[string]string
		src Source
	}{{annotations, SourceAnnotation}, {labels, SourceLabel}} {
		for k, v := range m.kv {
			if strings.HasPrefix(k, AnnotationPrefix) && !known[k] ||
				m.src == SourceAnnotation && strings.HasPrefix(k, CeilingAnnotationPrefix) && !isCeilingKey(k) {
				out = append(out, UnknownKey{Key: k, Value: v, Source: m.src})
			}
		}
	}
	for k, v := range envm {
		if strings.HasPrefix(k, EnvPrefix) && !known[k] && !IsRuntimeEnv(k) && !isCeilingKey(k) {
			out = append(out, UnknownKey{Key: k, Value: v, Source: SourceEnv})
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Key != out[j].Key {
			return out[i].Key < out[j].Key
		}
		return out[i].Source < out[j].Source
	})
	return out
}

// CheckKeys returns a *FieldError for every unknown key (UnknownKeys), joined, or nil. Each names the key, its
// source, the closest valid key when it looks like a misspelling, and every valid key of its kind.
func CheckKeys(annotations, labels map[string]string, env []string) error {
	return checkKeys(annotations, labels, envMap(env))
}

func checkKeys(annotations, labels, envm map[string]string) error {
	var errs []error
	for _, u := range unknownKeys(annotations, labels, envm) {
		errs = append(errs, unknownKeyError(u))
	}
	return errors.Join(errs...)
}

func unknownKeyError(u UnknownKey) *FieldError {
	valid := make([]string, len(Fields))
	for i, f := range Fields {
		if u.Source == SourceEnv {
			valid[i] = f.EnvKey()
		} else {
			valid[i] = f.AnnotationKey()
		}
	}
	msg := "not a DetShare key"
	if near := closest(u.Key, valid); near != "" {
		msg += fmt.Sprintf(" (did you mean %s?)", near)
	}
	msg += "; valid keys are " + strings.Join(valid, ", ")
	if u.Source == SourceEnv {
		msg += " (DETSHARE_ variables DetShare itself uses, such as DETSHARE_RUN_DIR, are allowed: docs/table.md)"
	}
	return &FieldError{Key: u.Key, Value: u.Value, Source: u.Source, Allowed: msg}
}

// closest is the valid key within edit distance 2 of key (case-insensitive), or "".
func closest(key string, valid []string) string {
	best, bestD := "", 3
	for _, v := range valid {
		if d := editDistance(strings.ToLower(key), strings.ToLower(v)); d < bestD {
			best, bestD = v, d
		}
	}
	return best
}

// editDistance is the Damerau-Levenshtein (optimal string alignment) distance: a swap of neighbours (TEIR) is 1.
func editDistance(a, b string) int {
	d := make([][]int, len(a)+1)
	for i := range d {
		d[i] = make([]int, len(b)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(a); i++ {
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(a)][len(b)]
}
