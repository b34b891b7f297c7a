// Package atomicfile writes a file so that readers see either the old content or the new, never a torn one, and a
// crash leaves no partial file behind: quota files, OCI specs, engine configurations and preload lists all go
// through it.
package atomicfile

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// tempInfix sits between a temporary's target and its random suffix: "." + target + tempInfix + random.
const tempInfix = ".tmp-"

// TemporaryPattern is the glob of Write's temporaries in dir, for sweeping those a writer that died left behind.
func TemporaryPattern(dir string) string { return filepath.Join(dir, ".*"+tempInfix+"*") }

// TargetOf is the base name of the file that the temporary named tmpBase (a base name) was to replace, and whether
// tmpBase is one of Write's temporaries at all.
func TargetOf(tmpBase string) (string, bool) {
	i := strings.LastIndex(tmpBase, tempInfix)
	if !strings.HasPrefix(tmpBase, ".") || i < 2 {
		return "", false
	}
	return tmpBase[1:i], true
}

// Write replaces path with data (mode perm) through a temporary file in the same directory and a rename. With
// durable set, the data is fsynced first (engine configurations must survive a power loss). Errors name path.
func Write(path string, data []byte, perm os.FileMode, durable bool) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+tempInfix+"*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	committed := false
	defer func() {
		if !committed {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if _, err := tmp.Write(data); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := tmp.Chmod(perm); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if durable {
		if err := tmp.Sync(); err != nil {
			return fmt.Errorf("write %s: %w", path, err)
		}
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("write %s: %w", path, err)
	}
	committed = true
	return nil
}
