package cdi

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/detshare/detshare/internal/atomicfile"
)

// CacheFile is the file in Driver.CacheDir that holds the last generated common edit (the driver's control nodes,
// libraries, tools and loader hook), so that a container start does not list the library directories and run
// `ldconfig -p` again (issue 28). It is used only while its key still matches: the driver version, the root and
// hook, and the identity and modification time of the loader cache, every searched library and tool directory,
// every directory an edit mount comes from and every control node. Installing, removing or upgrading a driver
// changes one of them.
const CacheFile = "cdi-driver-edit.json"

type cachedEdit struct {
	Key     string         `json:"key"`
	DirsKey string         `json:"dirs_key"` // the key of the directories Edits mounts from
	Dirs    []string       `json:"dirs"`
	Edits   ContainerEdits `json:"edits"`
}

// cacheKey is the key of the fixed inputs of Common ("" when the driver version is unknown: nothing is cached).
func (d Driver) cacheKey() string {
	v := d.DriverVersion()
	if v == "" {
		return ""
	}
	paths := []string{"/etc/ld.so.cache", "/run/nvidia-persistenced/socket"}
	for _, c := range controlNodes {
		paths = append(paths, c.path)
	}
	paths = append(append(paths, libDirs...), binDirs...)
	return fmt.Sprintf("driver=%s root=%s hook=%s %s", v, d.Root, d.HookPath, d.statKey(paths))
}

// statKey identifies the files at paths (under Root) as they are now: device, inode, modification time, device
// numbers; "-" for an absent one.
func (d Driver) statKey(paths []string) string {
	var b strings.Builder
	for _, p := range paths {
		var st unix.Stat_t
		if err := unix.Stat(Join(d.Root, p), &st); err != nil {
			fmt.Fprintf(&b, "|%s:-", p)
			continue
		}
		fmt.Fprintf(&b, "|%s:%d:%d:%d.%09d:%d", p, st.Dev, st.Ino, st.Mtim.Sec, st.Mtim.Nsec, st.Rdev)
	}
	return b.String()
}

// mountDirs are the host directories e's mounts come from (without Root).
func (d Driver) mountDirs(e ContainerEdits) []string {
	var dirs []string
	for _, m := range e.Mounts {
		p := m.HostPath
		if d.Root != "" {
			p = strings.TrimPrefix(p, filepath.Clean(d.Root))
		}
		dirs = append(dirs, filepath.Dir(p))
	}
	return uniq(dirs)
}

// cachedCommon returns the cached common edit when its key matches.
func (d Driver) cachedCommon(key string) (ContainerEdits, bool) {
	data, err := os.ReadFile(filepath.Join(d.CacheDir, CacheFile))
	if err != nil {
		return ContainerEdits{}, false
	}
	var c cachedEdit
	if err := json.Unmarshal(data, &c); err != nil || c.Key != key || c.DirsKey != d.statKey(c.Dirs) {
		return ContainerEdits{}, false
	}
	return c.Edits, true
}

// storeCommon writes e as the cached common edit under key; a failure only costs the next start a regeneration.
func (d Driver) storeCommon(key string, e ContainerEdits) {
	dirs := d.mountDirs(e)
	data, err := json.Marshal(cachedEdit{Key: key, DirsKey: d.statKey(dirs), Dirs: dirs, Edits: e})
	if err == nil {
		err = atomicfile.Write(filepath.Join(d.CacheDir, CacheFile), data, 0o644, false)
	}
	if err != nil {
		logrus.WithError(err).WithField("dir", d.CacheDir).Debug("driver edit not cached")
	}
}
