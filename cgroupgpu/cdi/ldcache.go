package cdi

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// LdconfConf is the loader configuration file UpdateLDCache writes in the container.
const LdconfConf = "/etc/ld.so.conf.d/000-detshare-gpu.conf"

// UpdateLDCache makes the loader of the container whose root filesystem is at rootfs find the libraries in folders
// (container paths): it writes them to LdconfConf (when the image has /etc/ld.so.conf.d) and rebuilds the image's
// /etc/ld.so.cache with the host's ldconfig run on rootfs (`ldconfig -r`), which also creates the sonames. It
// needs nothing from the image; an image without a glibc loader cache (musl, static) is left as it is.
func UpdateLDCache(rootfs string, folders []string) error {
	if len(folders) == 0 {
		return nil
	}
	for _, f := range folders {
		if !filepath.IsAbs(f) {
			return fmt.Errorf("ldcache folder %q: must be an absolute container path", f)
		}
	}
	if _, err := os.Stat(filepath.Join(rootfs, "etc")); err != nil {
		return fmt.Errorf("container root %s has no /etc: %w", rootfs, err)
	}
	if st, err := os.Stat(filepath.Join(rootfs, "etc/ld.so.conf.d")); err == nil && st.IsDir() {
		conf := filepath.Join(rootfs, LdconfConf)
		// The image's own file of that name is not ours to replace through a symlink.
		if fi, err := os.Lstat(conf); err == nil && fi.Mode()&os.ModeSymlink != 0 {
			return fmt.Errorf("%s is a symlink in the image; not written", LdconfConf)
		}
		if err := os.WriteFile(conf, []byte(strings.Join(folders, "\n")+"\n"), 0o644); err != nil {
			return fmt.Errorf("write %s: %w", LdconfConf, err)
		}
	}
	ldconfig := ""
	for _, p := range []string{"/sbin/ldconfig.real", "/sbin/ldconfig", "/usr/sbin/ldconfig"} {
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() {
			ldconfig = p
			break
		}
	}
	if ldconfig == "" {
		return errors.New("the host has no ldconfig (/sbin/ldconfig)")
	}
	// The folders on the command line too: an image whose /etc/ld.so.conf does not include ld.so.conf.d still
	// gets them in this cache.
	args := append([]string{"-r", rootfs}, folders...)
	if out, err := exec.Command(ldconfig, args...).CombinedOutput(); err != nil {
		return fmt.Errorf("%s %s: %w: %s", ldconfig, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}
