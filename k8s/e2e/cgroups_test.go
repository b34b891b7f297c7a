package e2e

import (
	"os"
	"path/filepath"
	"sort"
)

// kubepodsCgroups lists the kubepods cgroup directories kubelet (cgroupfs driver, cgroup v1) creates under every
// hierarchy, that exist now.
func kubepodsCgroups() map[string]bool {
	out := map[string]bool{}
	dirs, _ := filepath.Glob("/sys/fs/cgroup/*/kubepods")
	for _, d := range dirs {
		out[d] = true
	}
	if _, err := os.Stat("/sys/fs/cgroup/kubepods"); err == nil { // cgroup v2
		out["/sys/fs/cgroup/kubepods"] = true
	}
	return out
}

// removeNewCgroups removes the kubepods trees that were not there before the test (empty cgroups only: rmdir).
func removeNewCgroups(before map[string]bool) {
	for d := range kubepodsCgroups() {
		if before[d] {
			continue
		}
		var all []string
		filepath.WalkDir(d, func(p string, e os.DirEntry, err error) error {
			if err == nil && e.IsDir() {
				all = append(all, p)
			}
			return nil
		})
		sort.Slice(all, func(i, j int) bool { return len(all[i]) > len(all[j]) })
		for _, p := range all {
			os.Remove(p)
		}
	}
}
